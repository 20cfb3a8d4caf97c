#!/usr/bin/python3
"""Golden files for tests/test_fasterrcnn.c (Faster and Mask R-CNN).

Run once with Debian's interpreter (python3-torch, python3-torchvision 0.14):
    /usr/bin/python3 tests/golden/gen_fasterrcnn.py [OUTDIR]

The model is torchvision's own Faster R-CNN pieces -- BackboneWithFPN with
LastLevelMaxPool around gen_resnet.py's ResNet replica (torchvision's module
tree with a width knob), AnchorGenerator, RPNHead, RegionProposalNetwork,
MultiScaleRoIAlign, TwoMLPHead, FastRCNNPredictor and RoIHeads -- under the
attribute names of fasterrcnn_resnet50_fpn, so the state-dict names are
torchvision's.  Weights and images come from the counter hash both sides
compute (ps_rcnn_init), the ground truth is written into the golden.

Randomness is taken out as follows, and both sides do the same:
  * the fg/bg samplers of the RPN and the box head are replaced by
    HashSampler, the sampler of worker/det/det_rcnn.h (the positives and
    negatives with the smallest counter hash, key ps_det_sample_key(SEED,
    site, image)) -- a uniformly random subset as torchvision's
    permutations draw, but one C can reproduce;
  * the box head runs on pinned proposals: the float64 RPN's, rounded to
    float32 and written here, so a proposal that NMS or the top-n cut keeps
    in one precision and drops in the other cannot make the two box heads
    see different RoIs (test_fasterrcnn compares the C RPN's own proposals
    with these separately).
Then the four losses, samples of the RPN and box head outputs and, for
every parameter, its gradient norm and a deterministic sample (the
retinanet_*.txt format, with PyTorch's own float32 noise recorded) are
written; and in eval mode the box head outputs on pinned test proposals
and torchvision's post-processed detections.  The backbone runs with frozen
BN, as ps_rcnn_t always does.

The Cascade R-CNN variant (cascade_r18.txt) replaces RoIHeads by
cascade_ref.CascadeHeads (Detectron2's CascadeROIHeads semantics on
torchvision's pieces; stage 0 sampled by RoIHeads.select_training_samples
with the hash sampler) and writes each stage's losses, RoIs and outputs.

The Mask R-CNN variant (maskrcnn_r18.txt) adds maskrcnn_resnet50_fpn's
mask branch to RoIHeads (MultiScaleRoIAlign 14, MaskRCNNHeads,
MaskRCNNPredictor) and each ground-truth box's mask (the ellipse inscribed
in it, written as "gtmask IMAGE BOX 0101..."), and writes loss_mask, the
positive RoIs' labels and mask logits, and in eval mode a sample of each
detection's mask probabilities (maskrcnn_inference on the detections).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cascade_ref as C  # noqa: E402
import gen_resnet as G  # noqa: E402
import gen_retinanet as R  # noqa: E402

from torchvision.models.detection.anchor_utils import AnchorGenerator  # noqa: E402
from torchvision.models.detection.backbone_utils import BackboneWithFPN  # noqa: E402
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead  # noqa: E402
from torchvision.models.detection.image_list import ImageList  # noqa: E402
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor  # noqa: E402
from torchvision.models.detection.roi_heads import maskrcnn_inference  # noqa: E402
from torchvision.models.detection.roi_heads import RoIHeads  # noqa: E402
from torchvision.models.detection.rpn import (RegionProposalNetwork, RPNHead,  # noqa: E402
                                              concat_box_prediction_layers)
from torchvision.ops import MultiScaleRoIAlign  # noqa: E402
from torchvision.ops.poolers import LevelMapper  # noqa: E402
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool  # noqa: E402

SEED = 1234
GOLDEN = 0x9E3779B97F4A7C15

VARIANTS = [
    # name, depth, width, fpn, K, images, H, freeze_at, representation, rpn batch,
    # box batch, RPN pre / post NMS train, pre / post test, random init (random
    # BN, RPN convs +-0.1), input scale, gradient samples.  The input scales
    # keep the FPN's outputs near 1 (the frozen BN does not normalise: the
    # ResNet-50's random BN would grow them past 100), so the RPN proposes
    # boxes of every size instead of the whole image.
    ("r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 32),
    ("r50", 50, 8, 16, 2, 1, 64, 2, 32, 2048, 512, 200, 100, 100, 50, 0, 0.1, 32),
    ("mask_r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 32),
    ("cascade_r18", 18, 8, 16, 3, 2, 64, 0, 32, 64, 64, 200, 100, 100, 50, 1, 0.25, 32),
]
CASCADE = {"cascade_r18"}
# the mask branch's width of the Mask R-CNN variants (MaskRCNNHeads' layers)
MASK_DIM = {"mask_r18": 8}
# pixels of each detection's 28 x 28 mask sampled into the golden
MASK_PIXELS = [(k * 97 + 13) % 784 for k in range(24)]
# r50 samples every anchor and every RoI, so every FPN level gets gradient
# from both heads; r18's 64 of 1023 anchors leave P5 / P6 out (its
# layer_blocks.3 gradient is 0 on both sides).  At 64 px the RPN's
# proposals all map to P2, so the pinned proposals' last four are replaced
# by boxes reaching past the image (given proposals are not clipped, in
# torchvision either): squares of side 110, 220, 440 and 460 around the
# image, just below the level mapper's boundaries 112, 224, 448 (P2, P3,
# P4) and just above the last (P5).
EXTRA = [(32.0 - s / 2, 30.0 - s / 2, 32.0 + s / 2, 30.0 + s / 2) for s in (110, 220, 440, 460)]
# ground truth per image: x1 y1 x2 y2 class (0..K-1; taken mod K)
GT = [[(4.0, 6.0, 30.0, 40.0, 0), (20.0, 18.0, 60.0, 58.0, 2), (40.0, 2.0, 62.0, 24.0, 1)],
      [(10.0, 10.0, 50.0, 50.0, 1), (0.0, 30.0, 20.0, 63.0, 0)]]


def sample_key(seed, site, image):
    """ps_det_sample_key"""
    return (seed ^ ((GOLDEN * (site * 65536 + image + 1)) & G.M64)) & G.M64


class HashSampler:
    """ps_det_sample_balanced: BalancedPositiveNegativeSampler with the
    permutations replaced by the counter hash (smallest (hash, index) first)."""

    def __init__(self, batch, fraction, seed, site):
        self.batch, self.fraction, self.seed, self.site = batch, fraction, seed, site

    def __call__(self, matched_idxs):
        pos_masks, neg_masks = [], []
        for i, m in enumerate(matched_idxs):
            u = torch.from_numpy(G.rng_u24(sample_key(self.seed, self.site, i), m.numel())
                                 .astype(np.int64))
            positive = torch.where(m >= 1)[0]
            negative = torch.where(m == 0)[0]
            num_pos = min(positive.numel(), int(np.float32(self.batch) * np.float32(self.fraction)))
            num_neg = min(negative.numel(), self.batch - num_pos)
            masks = []
            for idx, take in ((positive, num_pos), (negative, num_neg)):
                order = torch.argsort(u[idx] * (1 << 32) + idx)[:take]
                mask = torch.zeros_like(m, dtype=torch.uint8)
                mask[idx[order]] = 1
                masks.append(mask)
            pos_masks.append(masks[0])
            neg_masks.append(masks[1])
        return pos_masks, neg_masks


class FasterRCNNParts(nn.Module):
    """fasterrcnn_resnet50_fpn's modules (same attribute names) on a replica
    ResNet of any depth and width, without GeneralizedRCNNTransform."""

    def __init__(self, v):
        super().__init__()
        _, depth, width, fpn, K, _, _, _, rep, rpn_b, box_b, pre_tr, post_tr, pre_te, post_te = v[:15]
        body = G.ResNetReplica(depth, 1, width)
        c5 = (width << 3) * (4 if depth == 50 else 1)
        self.backbone = BackboneWithFPN(body, {"layer1": "0", "layer2": "1", "layer3": "2",
                                               "layer4": "3"},
                                        [c5 // 8, c5 // 4, c5 // 2, c5], fpn,
                                        extra_blocks=LastLevelMaxPool())
        anchors = AnchorGenerator(((32,), (64,), (128,), (256,), (512,)), ((0.5, 1.0, 2.0),) * 5)
        self.rpn = RegionProposalNetwork(anchors, RPNHead(fpn, 3), 0.7, 0.3, rpn_b, 0.5,
                                         dict(training=pre_tr, testing=pre_te),
                                         dict(training=post_tr, testing=post_te), 0.7)
        self.roi_heads = RoIHeads(MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2),
                                  TwoMLPHead(fpn * 49, rep), FastRCNNPredictor(rep, K + 1),
                                  0.5, 0.5, box_b, 0.25, None, 0.05, 0.5, 100)
        if v[0] in CASCADE:  # Detectron2's CascadeROIHeads in the place of RoIHeads
            self.roi_heads = C.CascadeHeads(MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2), fpn,
                                            rep, K, self.roi_heads)
        D = MASK_DIM.get(v[0])
        if D:  # maskrcnn_resnet50_fpn's mask branch
            self.roi_heads.mask_roi_pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 14, 2)
            self.roi_heads.mask_head = MaskRCNNHeads(fpn, (D, D, D, D), 1)
            self.roi_heads.mask_predictor = MaskRCNNPredictor(D, D, K + 1)


def hash_init(net, seed, random):
    """ps_rcnn_init(m, seed, random): RetinaNet's rules for the backbone, the
    FPN and the conv biases (gen_retinanet.hash_init), the RPN's weights
    uniform in +-0.1 (random) or +-0.01 sqrt(3) (normal, std 0.01), and
    nn.Linear's default for the box head."""
    R.hash_init(net, seed, random)
    sd = net.state_dict()
    with torch.no_grad():
        for k, t in sd.items():
            if k.startswith("rpn.head.") and t.dim() == 4:
                v = G.hash_fill(t.numel(), k, seed, 0.1 if random else 0.01 * math.sqrt(3.0))
            elif k.startswith("roi_heads.mask_"):
                v = mask_init(sd, k, t, seed, random)
            elif k.startswith("roi_heads."):
                fan_in = sd[k.rsplit(".", 1)[0] + ".weight"].shape[1]
                v = G.hash_fill(t.numel(), k, seed, 1.0 / math.sqrt(fan_in))
            else:
                continue
            t.copy_(torch.from_numpy(v).view(t.shape))


def mask_init(sd, k, t, seed, random):
    """ps_rcnn_mask_init: kaiming_normal_(fan_out, relu) as a uniform of its
    std for every weight; the heads' biases 0 (random: +-0.1), the
    predictor's PyTorch's default (+-1/sqrt(fan_in))"""
    if k.endswith(".weight"):
        fan_out = t.shape[0] * t[0, 0].numel()
        return G.hash_fill(t.numel(), k, seed, math.sqrt(3.0 * 2.0 / fan_out))
    w = sd[k.rsplit(".", 1)[0] + ".weight"]
    if "mask_head" in k:
        return G.hash_fill(t.numel(), k, seed, 0.1) if random else np.zeros(t.numel(), np.float32)
    return G.hash_fill(t.numel(), k, seed, 1.0 / math.sqrt(w.shape[1] * w[0, 0].numel()))


def gt_mask(box, H):
    """the ellipse inscribed in box: pixels whose centres lie inside it"""
    x1, y1, x2, y2 = box[:4]
    ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float64) + 0.5,
                            torch.arange(H, dtype=torch.float64) + 0.5, indexing="ij")
    cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    return (((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1.0).to(torch.uint8)


def make_targets(K, n, dtype, H=0):
    t = [{"boxes": torch.tensor([b[:4] for b in GT[i]], dtype=dtype),
          "labels": torch.tensor([b[4] % K + 1 for b in GT[i]], dtype=torch.int64)}
         for i in range(n)]
    for i in range(n if H else 0):
        t[i]["masks"] = torch.stack([gt_mask(b, H) for b in GT[i]])
    return t


def hash_input(v):
    n, H, scale = v[5], v[6], v[16]
    return torch.from_numpy(G.hash_fill(n * 3 * H * H, "input", SEED, scale)).view(n, 3, H, H)


def build(v, dtype):
    name, depth, width, fpn, K, n, H, freeze_at, _, rpn_b, box_b = v[:11]
    torch.manual_seed(0)
    net = FasterRCNNParts(v)
    hash_init(net, SEED, bool(v[15]))
    if name in CASCADE:
        C.init(net, SEED, G.hash_fill)
    net.to(dtype)
    net.rpn.fg_bg_sampler = HashSampler(rpn_b, 0.5, SEED, 0)
    sampling = net.roi_heads._sampling[0] if name in CASCADE else net.roi_heads
    sampling.fg_bg_sampler = HashSampler(box_b, 0.25, SEED, 1)
    x = hash_input(v).to(dtype)
    return net, x, ImageList(x, [(H, H)] * n)


def grads_of(net):
    return {k: (p.grad.flatten().double() if p.grad is not None
                else torch.zeros(p.numel(), dtype=torch.float64))
            for k, p in net.named_parameters()}


def train_run(v, dtype, pinned=None):
    """training forward and backward on the pinned proposals (the float64
    RPN's rounded, the last four EXTRA): the losses, outputs, gradients"""
    K, n, freeze_at = v[4], v[5], v[7]
    net, x, images = build(v, dtype)
    net.train()
    R.freeze(net, freeze_at)
    mask, cascade = v[0] in MASK_DIM, v[0] in CASCADE
    targets = make_targets(K, n, dtype, v[6] if mask else 0)
    feats = net.backbone(x)
    obj, dl = concat_box_prediction_layers(*net.rpn.head(list(feats.values())))
    props, rpn_losses = net.rpn(images, feats, targets)
    if pinned is None:
        pinned = [torch.cat([p.detach().float()[:-len(EXTRA)], torch.tensor(EXTRA)]) for p in props]
    P = [p.to(dtype) for p in pinned]
    out = dict(obj=obj.detach().double(), props=[p.detach() for p in props],
               dl=dl.detach().double(), pinned=pinned, net=net, targets=targets)
    if cascade:
        roi_losses, stages = net.roi_heads.forward_train(feats, P, images.image_sizes, targets)
        losses = {**rpn_losses, **roi_losses}
        sum(v for k, v in losses.items() if "stage" not in k).backward()
        s0 = stages[0]
        out.update(rois=s0["rois"], labels=s0["labels"], cls=s0["cls"].detach().double(),
                   reg=s0["reg"].detach().double(), stages=stages)
    else:
        rois, _, labels, _ = net.roi_heads.select_training_samples([p.clone() for p in P],
                                                                   targets)
        _, roi_losses = net.roi_heads(feats, P, images.image_sizes, targets)
        losses = {**rpn_losses, **roi_losses}
        sum(losses.values()).backward()
        with torch.no_grad():
            rh = net.roi_heads
            cls, reg = rh.box_predictor(rh.box_head(rh.box_roi_pool(feats, rois,
                                                                    images.image_sizes)))
            mlog = mlab = None
            if mask:  # the positive RoIs' mask logits, as roi_heads' training forward makes them
                pos = [r[lb > 0] for r, lb in zip(rois, labels)]
                mlab = torch.cat([lb[lb > 0] for lb in labels])
                mlog = rh.mask_predictor(rh.mask_head(rh.mask_roi_pool(feats, pos,
                                                                       images.image_sizes)))
        out.update(rois=rois, labels=labels, cls=cls.double(), reg=reg.double(),
                   mask_logits=None if mlog is None else mlog.double(), mask_labels=mlab)
    out.update(losses={k: v.item() for k, v in losses.items()}, grads=grads_of(net))
    return out


def eval_run(net, v):
    """eval mode on the pinned test proposals: (pinned, class logits, box
    deltas, boxes, scores, labels, the RPN's proposals, mask probabilities,
    the cascade's stages)"""
    n, H = v[5], v[6]
    x = hash_input(v).double()
    images = ImageList(x, [(H, H)] * n)
    net.eval()
    with torch.no_grad():
        feats = net.backbone(x)
        props, _ = net.rpn(images, feats)
        pinned = [torch.cat([p.float()[:-len(EXTRA)], torch.tensor(EXTRA)]) for p in props]
        P = [p.double() for p in pinned]
        rh = net.roi_heads
        if v[0] in CASCADE:
            dets, stages = rh.forward_eval(feats, P, images.image_sizes)
            return (pinned, stages[0]["cls"], stages[0]["reg"], [d[0] for d in dets],
                    [d[1] for d in dets], [d[2] for d in dets], props, None, stages)
        cls, reg = rh.box_predictor(rh.box_head(rh.box_roi_pool(feats, P, images.image_sizes)))
        boxes, scores, labels = rh.postprocess_detections(cls, reg, P, images.image_sizes)
        probs = None
        if v[0] in MASK_DIM:  # roi_heads' eval forward: the mask branch on the detections
            x = rh.mask_predictor(rh.mask_head(rh.mask_roi_pool(feats, boxes,
                                                                images.image_sizes)))
            probs = maskrcnn_inference(x, labels)
    return pinned, cls, reg, boxes, scores, labels, props, probs, None


def samples(what, t, count):
    t = t.flatten()
    idx = G.sample_indices(what, t.numel(), count)
    return "%s %d %s" % (what, t.numel(), " ".join("%d:%.9g" % (i, t[i].item()) for i in idx))


def box_lines(tag, per_image):
    out = []
    for i, b in enumerate(per_image):
        for r in b.tolist():
            out.append("%s %d %s" % (tag, i, " ".join("%.9g" % c for c in r)))
    return out


def gen(outdir, v):
    name, K, n, nsamp = v[0], v[4], v[5], v[-1]
    cascade = name in CASCADE
    ref = train_run(v, torch.float64)
    r32 = train_run(v, torch.float32, ref["pinned"])
    ev = eval_run(ref["net"], v)
    A = ref["obj"].numel() // n
    lines = ["# %s: Faster R-CNN ResNet-%d width %d fpn %d K %d images %d %dx%d freeze_at %d "
             "representation %d rpn_batch %d box_batch %d rpn train %d/%d test %d/%d random %d "
             "input scale %g seed %d" % (name, *v[1:7], v[6], *v[7:17], SEED),
             "# reference: PyTorch float64; grad NAME NUMEL NORM NOISE_MAX NOISE_P90 "
             "NOISE_NORM IDX:VAL...",
             "anchors %d" % A]
    for i in range(n):
        for b in GT[i]:
            lines.append("gt %d %g %g %g %g %d" % (i, *b[:4], b[4] % K))
    if name in MASK_DIM:
        lines[0] += " mask_dim %d" % MASK_DIM[name]
        for i in range(n):
            for j, mk in enumerate(ref["targets"][i]["masks"]):
                lines.append("gtmask %d %d %s" % (i, j, "".join(str(int(b)) for b in
                                                                mk.flatten().tolist())))
    lines += box_lines("prop_train", ref["pinned"])
    lines += box_lines("prop_eval", ev[0])
    # the RPN's own proposals (float64) for the comparison with C's
    lines += box_lines("rpn_train", ref["props"])
    lines += box_lines("rpn_eval", ev[6])
    for k, val in ref["losses"].items():
        lines.append("%s %.12g" % (k, val))
    lines.append(samples("objectness", ref["obj"], 64))
    lines.append(samples("rpn_deltas", ref["dl"], 64))
    lines += box_lines("roi", ref["rois"])
    lines.append("roi_labels %s" % " ".join(str(int(x) - 0) for x in torch.cat(ref["labels"])))
    lines.append(samples("class_logits", ref["cls"], 64))
    lines.append(samples("box_regression", ref["reg"], 64))
    lines.append(samples("eval_class_logits", ev[1], 64))
    lines.append(samples("eval_box_regression", ev[2], 64))
    for i in range(n):
        for b, s, c in zip(ev[3][i].tolist(), ev[4][i].tolist(), ev[5][i].tolist()):
            lines.append("det %d %.9g %d %s" % (i, s, c - 1, " ".join("%.9g" % x for x in b)))
    if cascade:  # stages 1 and 2: their RoIs (stage k-1's boxes), labels and outputs
        for k in (1, 2):
            st = ref["stages"][k]
            lines += box_lines("s%d_roi" % k, st["rois"])
            lines.append("s%d_roi_labels %s" % (k, " ".join(str(int(x)) for x in
                                                           torch.cat(st["labels"]))))
            lines.append(samples("s%d_class_logits" % k, st["cls"].detach().double(), 64))
            lines.append(samples("s%d_box_regression" % k, st["reg"].detach().double(), 64))
            se = ev[8][k]
            lines.append(samples("s%d_eval_class_logits" % k, se["cls"].double(), 64))
    if name in MASK_DIM:
        lines.append("loss_mask_labels %s" % " ".join(str(int(x)) for x in ref["mask_labels"]))
        lines.append(samples("mask_logits", ref["mask_logits"], 64))
        # each detection's mask: "dmask IMAGE DET p:v ..." (det in the order of the det lines)
        for i in range(n):
            for d, pr in enumerate(ev[7][i]):
                pr = pr.flatten()
                lines.append("dmask %d %d %s" % (i, d, " ".join("%d:%.9g" % (p, pr[p].item())
                                                                for p in MASK_PIXELS)))
    for k, g in ref["grads"].items():
        nrm = g.norm().item()
        rms = nrm / math.sqrt(g.numel())
        e32 = (r32["grads"][k] - g).abs() / rms if rms > 0 else torch.zeros(1, dtype=torch.float64)
        idx = G.sample_indices(k, g.numel(), nsamp)
        lines.append("grad %s %d %.12g %.3g %.3g %.3g %s" % (
            k, g.numel(), nrm, e32.max().item(), torch.quantile(e32.float(), 0.9).item(),
            abs(r32["grads"][k].norm().item() - nrm) / nrm if nrm > 0 else 0.0,
            " ".join("%d:%.9g" % (i, g[i].item()) for i in idx)))
    fname = ("maskrcnn_%s.txt" % name[5:] if name in MASK_DIM else
             "%s.txt" % name if cascade else "fasterrcnn_%s.txt" % name)
    with open(os.path.join(outdir, fname), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %s; %d RoIs, %d eval detections" % (
        name, " ".join("%s %.5f" % kv for kv in ref["losses"].items()),
        sum(len(r) for r in ref["rois"]), sum(len(b) for b in ev[3])))


def gen_levels(outdir):
    """torchvision's LevelMapper (k 2..5, canonical 224 at level 4, eps 1e-6)
    in float32 on squares and rectangles at and around every boundary (112,
    224, 448 and their float neighbours, where the eps decides), tiny, huge
    and empty boxes: fasterrcnn_levels.txt, "level x1 y1 x2 y2 LEVEL"."""
    sides = [1e-3, 1.0, 55.9, 56.0, 111.99, 112.0, 112.01, 150.0, 223.99, 224.0, 224.01,
             447.9, 448.0, 448.1, 896.0, 1e4]
    boxes = [(10.0, 20.0, 10.0 + s, 20.0 + s) for s in sides]
    boxes += [(0.0, 0.0, 56.0, 224.0), (3.5, 7.25, 3.5 + 224.0, 7.25 + 56.0),
              (0.0, 0.0, 64.0, 784.0), (5.0, 5.0, 5.0, 90.0)]
    b = torch.tensor(boxes, dtype=torch.float32)
    lv = LevelMapper(2, 5, 224, 4, 1e-6)([b])
    with open(os.path.join(outdir, "fasterrcnn_levels.txt"), "w") as f:
        f.write("# torchvision LevelMapper(2, 5, 224, 4, 1e-6) in float32: level x1 y1 x2 y2 "
                "LEVEL (0..3 = P2..P5)\n")
        for r, l in zip(b.tolist(), lv.tolist()):
            f.write("level %.9g %.9g %.9g %.9g %d\n" % (*r, l))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.set_num_threads(2)
    gen_levels(outdir)
    for v in VARIANTS:
        gen(outdir, v)


if __name__ == "__main__":
    main()
