"""Cascade R-CNN's box heads in PyTorch, written from Detectron2's published
semantics (detectron2/modeling/roi_heads/cascade_rcnn.py, CascadeROIHeads,
and FastRCNNOutputLayers) on torchvision's pieces, as the reference of
worker/models/rcnn_box.c's cascade (torchvision has no Cascade R-CNN):

  * three stages, each a TwoMLPHead (fc6, fc7) and a predictor with K+1
    class scores and 4 class-agnostic deltas, under the names
    roi_heads.box_head.k.*, roi_heads.box_predictor.k.* (ModuleLists);
  * stage 0 trains on RoIHeads.select_training_samples' sample (proposals
    with the ground truth appended, Matcher 0.5 / 0.5, the fg/bg sampler,
    targets coded with (10, 10, 5, 5));
  * stage k > 0 trains on stage k-1's boxes: its deltas decoded with its
    weights on its RoIs, detached, clipped to the image, empty ones dropped,
    matched at IoU 0.6 / 0.7 without low-quality matches (every box kept:
    no sampling, no ground truth appended), targets coded with (20, 20, 10,
    10) / (30, 30, 15, 15);
  * losses per stage: cross-entropy (mean) and smooth-L1 with Detectron2's
    beta 0 (L1) on the foreground rows, summed over the RoIs and divided by
    their count; the stages' losses add up, and the gradient into each
    stage's pooled features is scaled by 1/3 (_ScaleGradient);
  * inference: the stages run on each other's clipped boxes (none
    dropped), the class probabilities are the mean of the three softmaxes,
    the boxes the last stage's; then fast_rcnn_inference: scores > 0.05,
    class-wise NMS 0.5, the best 100 (no small-box removal).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.faster_rcnn import TwoMLPHead
from torchvision.ops import boxes as box_ops

IOUS = (0.5, 0.6, 0.7)
WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


class AgnosticPredictor(nn.Module):
    """K+1 class scores and one box (4 deltas) per RoI"""

    def __init__(self, rep, K1):
        super().__init__()
        self.cls_score = nn.Linear(rep, K1)
        self.bbox_pred = nn.Linear(rep, 4)

    def forward(self, x):
        return self.cls_score(x), self.bbox_pred(x)


class CascadeHeads(nn.Module):
    def __init__(self, pool, fpn, rep, K, sampling):
        """sampling: torchvision's RoIHeads whose select_training_samples
        makes stage 0's sample (kept outside the module tree)"""
        super().__init__()
        self.box_roi_pool = pool
        self.box_head = nn.ModuleList([TwoMLPHead(fpn * 49, rep) for _ in IOUS])
        self.box_predictor = nn.ModuleList([AgnosticPredictor(rep, K + 1) for _ in IOUS])
        self.coders = [det_utils.BoxCoder(w, math.log(1000.0 / 16)) for w in WEIGHTS]
        self._sampling = [sampling]

    def run(self, features, props, sizes, k):
        x = self.box_roi_pool(features, props, sizes)
        x = _ScaleGradient.apply(x, 1.0 / len(IOUS))
        return self.box_predictor[k](self.box_head[k](x))

    def refine(self, reg, props, sizes, k, training):
        """stage k's boxes from its deltas: decoded, detached, clipped
        (training: the empty ones dropped)"""
        boxes = self.coders[k].decode_single(reg.detach(), torch.cat(props))
        out, start = [], 0
        for p, s in zip(props, sizes):
            b = box_ops.clip_boxes_to_image(boxes[start:start + len(p)], s)
            start += len(p)
            if training:
                b = b[(b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])]
            out.append(b)
        return out

    def relabel(self, props, targets, k):
        matcher = det_utils.Matcher(IOUS[k], IOUS[k], False)
        labels, tgts = [], []
        for p, t in zip(props, targets):
            mi = matcher(box_ops.box_iou(t["boxes"], p))
            m = mi.clamp(min=0)
            lab = torch.where(mi >= 0, t["labels"][m], torch.zeros_like(m))
            labels.append(lab)
            tgts.append(self.coders[k].encode_single(t["boxes"][m], p))
        return labels, tgts

    def forward_train(self, features, proposals, sizes, targets):
        """the loss dict (per stage and summed) and each stage's RoIs,
        labels and outputs"""
        props, _, labels, tgts = self._sampling[0].select_training_samples(proposals, targets)
        losses, stages = {}, []
        for k in range(len(IOUS)):
            if k > 0:
                props = self.refine(stages[-1]["reg"], props, sizes, k - 1, True)
                labels, tgts = self.relabel(props, targets, k)
            cls, reg = self.run(features, props, sizes, k)
            lab, tgt = torch.cat(labels), torch.cat(tgts)
            pos = lab > 0
            lc = F.cross_entropy(cls, lab)
            lb = F.l1_loss(reg[pos], tgt[pos], reduction="sum") / max(lab.numel(), 1)
            losses["loss_classifier_stage%d" % k] = lc
            losses["loss_box_reg_stage%d" % k] = lb
            stages.append(dict(rois=[p.detach() for p in props], labels=[x.clone() for x in labels],
                               cls=cls, reg=reg))
        losses["loss_classifier"] = sum(losses["loss_classifier_stage%d" % k] for k in range(3))
        losses["loss_box_reg"] = sum(losses["loss_box_reg_stage%d" % k] for k in range(3))
        return losses, stages

    def forward_eval(self, features, proposals, sizes):
        props, probs, stages = proposals, [], []
        for k in range(len(IOUS)):
            if k > 0:
                props = self.refine(stages[-1]["reg"], props, sizes, k - 1, False)
            cls, reg = self.run(features, props, sizes, k)
            probs.append(F.softmax(cls, -1))
            stages.append(dict(rois=props, cls=cls, reg=reg))
        scores = sum(probs) / len(IOUS)
        boxes = self.refine(stages[-1]["reg"], props, sizes, len(IOUS) - 1, False)
        out, start = [], 0
        for b, s in zip(boxes, sizes):
            sc = scores[start:start + len(b), 1:]
            start += len(b)
            keep = torch.nonzero(sc > 0.05)
            bb, ss, cc = b[keep[:, 0]], sc[keep[:, 0], keep[:, 1]], keep[:, 1]
            k = box_ops.batched_nms(bb, ss, cc, 0.5)[:100]
            out.append((bb[k], ss[k], cc[k] + 1))
        return out, stages


def init(net, seed, hash_fill):
    """ps_rcnn_init's cascade heads: fc6 / fc7 kaiming_uniform(a=1) (bound
    sqrt(3 / fan_in)), cls_score and bbox_pred normal(0.01) / (0.001) as
    uniforms of those stds, biases 0"""
    with torch.no_grad():
        for k, t in net.state_dict().items():
            if not k.startswith("roi_heads.box_"):
                continue
            if k.endswith(".bias"):
                t.zero_()
                continue
            bound = (0.01 * math.sqrt(3.0) if ".cls_score." in k else
                     0.001 * math.sqrt(3.0) if ".bbox_pred." in k else
                     math.sqrt(3.0 / t.shape[1]))
            t.copy_(torch.from_numpy(hash_fill(t.numel(), k, seed, bound)).view(t.shape))
