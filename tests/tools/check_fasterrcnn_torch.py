#!/usr/bin/python3
"""C-written Faster R-CNN checkpoints in torchvision (run by
tests/check_fasterrcnn_torch.sh; TAP).

    check_fasterrcnn_torch.py DIR...

tests/tools/rcnn_export writes a Faster R-CNN-FPN and what the C engine
computes for the hash input in eval mode into each DIR (checked in order,
each introduced by a "# dir: DIR" line, in one process so torch is imported
once); here the checkpoint goes into the torchvision model of that shape
with load_state_dict(strict=True):
  * ResNet-50, width 64, FPN 256, box head 1024: fasterrcnn_resnet50_fpn
    (weights=None, num_classes=K+1) itself;
  * other depths with FPN 256 and box head 1024: FasterRCNN on
    resnet_fpn_backbone("resnetD"), as torchvision builds its variants;
  * other FPN / box head widths (a psworker export of a small model):
    FasterRCNN on BackboneWithFPN(resnetD, layer1..4, LastLevelMaxPool) with
    TwoMLPHead / FastRCNNPredictor of that width.
Then in eval mode, without GeneralizedRCNNTransform (the C model takes the
tensor as is, image size H x H): the RPN's objectness and deltas (rtol
1e-3, atol 1e-4 x max|ref|: float32 through ~60 layers in another order);
torchvision's proposals against C's as sets (each within 0.05 px; the
top-n / NMS decisions may flip on near ties, so >= 98% must match); the
box head on C's proposals (same tolerances); and torchvision's
postprocess_detections of those outputs against C's detections (same
class, score within 1e-3, box within 0.05 px; at most the export's MAXDET,
torchvision's detections_per_img).  A Mask R-CNN export goes
into maskrcnn_resnet50_fpn / MaskRCNN of its shape (MaskRCNNHeads and
MaskRCNNPredictor of its mask width), and torchvision's mask branch on C's
detections (maskrcnn_inference) is compared with C's mask probabilities.
A Cascade R-CNN export goes into FasterRCNN with its RoIHeads replaced by
tests/golden/cascade_ref.CascadeHeads (Detectron2's semantics; torchvision
has no Cascade R-CNN): the stage-0 outputs on C's proposals and the
cascade's detections (three stages, mean scores, last boxes) are compared.
"""
import os
import sys

import numpy as np
import torch

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))  # the golden generators
sys.path.insert(0, os.path.join(_here, "..", "lib"))     # taplib
import cascade_ref as CR  # noqa: E402
import gen_resnet as G  # noqa: E402
from taplib import ok, plan, strict_load  # noqa: E402


def build(K, depth, width, fpn, rep, mask=0, stages=1):
    if stages > 1:  # torchvision's FasterRCNN around Detectron2's cascade heads
        from torchvision.ops import MultiScaleRoIAlign
        net = build(K, depth, width, fpn, 1024 if rep == 1024 else rep)
        net.roi_heads = CR.CascadeHeads(MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2), fpn, rep,
                                        K, net.roi_heads)
        return net
    import torchvision
    from torchvision.models.detection import (FasterRCNN, MaskRCNN, fasterrcnn_resnet50_fpn,
                                              maskrcnn_resnet50_fpn)
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    from torchvision.models.detection.backbone_utils import BackboneWithFPN, resnet_fpn_backbone
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import misc
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
    if width != 64:
        raise SystemExit("width %d: torchvision's ResNets are width 64" % width)
    if (depth, fpn, rep, mask) == (50, 256, 1024, 256):
        return maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=K + 1)
    if (depth, fpn, rep, mask) == (50, 256, 1024, 0):
        return fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=K + 1)
    if (fpn, rep, mask) == (256, 1024, 256):
        bb = resnet_fpn_backbone(backbone_name="resnet%d" % depth, weights=None,
                                 trainable_layers=5)
        return MaskRCNN(bb, num_classes=K + 1)
    if (fpn, rep, mask) == (256, 1024, 0):
        bb = resnet_fpn_backbone(backbone_name="resnet%d" % depth, weights=None,
                                 trainable_layers=5)
        return FasterRCNN(bb, num_classes=K + 1)
    body = getattr(torchvision.models, "resnet%d" % depth)(weights=None,
                                                           norm_layer=misc.FrozenBatchNorm2d)
    c2 = body.inplanes // 8  # 64 (BasicBlock) or 256 (Bottleneck)
    bb = BackboneWithFPN(body, {"layer1": "0", "layer2": "1", "layer3": "2", "layer4": "3"},
                         [c2, 2 * c2, 4 * c2, 8 * c2], fpn, extra_blocks=LastLevelMaxPool())
    heads = dict(box_head=TwoMLPHead(fpn * 49, rep), box_predictor=FastRCNNPredictor(rep, K + 1))
    if not mask:
        return FasterRCNN(bb, num_classes=None, **heads)
    return MaskRCNN(bb, num_classes=None, mask_head=MaskRCNNHeads(fpn, (mask,) * 4, 1),
                    mask_predictor=MaskRCNNPredictor(mask, mask, K + 1), **heads)


def close(name, got, ref):
    if got.shape != ref.shape:
        ok(False, "%s: shape %s, torchvision %s" % (name, got.shape, ref.shape))
        return
    tol = 1e-4 * np.abs(ref).max() + 1e-3 * np.abs(ref)
    err = np.abs(got - ref)
    ok(bool((err <= tol).all()), "%s: %d values match torchvision (worst %.3g of max|ref| %.3g)"
       % (name, ref.size, err.max() if ref.size else 0, np.abs(ref).max() if ref.size else 0))


def matched(a, b, tol):
    """rows of a that have a row of b within tol (max abs over the row)"""
    if len(a) == 0 or len(b) == 0:
        return 0
    d = np.abs(a[:, None, :] - b[None, :, :]).max(axis=2)
    return int((d.min(axis=1) <= tol).sum())


def check(d):
    K, H, seed, A, P, D, depth, width, fpn, rep, mask, stages, maxdet = \
        [int(v) for v in open(os.path.join(d, "config.txt")).read().split()]
    raw = lambda name, cols: np.fromfile(os.path.join(d, name), dtype=np.float32).reshape(-1, cols)  # noqa: E731
    net = build(K, depth, width, fpn, rep, mask, stages)
    if stages > 1 and maxdet != 100:
        raise SystemExit("MAXDET %d: cascade_ref.CascadeHeads keeps 100" % maxdet)
    net.roi_heads.detections_per_img = maxdet
    sd, meta = G.read_safetensors(os.path.join(d, "model.safetensors"))
    kind = "maskrcnn" if mask else "cascade" if stages > 1 else "fasterrcnn"
    if not strict_load(net, sd, meta, "%s-resnet%d-fpn" % (kind, depth)):
        return
    from torchvision.models.detection.image_list import ImageList
    from torchvision.models.detection.rpn import concat_box_prediction_layers
    net.eval()
    x = torch.from_numpy(G.hash_fill(3 * H * H, "input", seed, 1.0)).view(1, 3, H, H)
    images = ImageList(x, [(H, H)])
    with torch.no_grad():
        feats = net.backbone(x)
        obj, dl = concat_box_prediction_layers(*net.rpn.head(list(feats.values())))
        close("RPN objectness", raw("objectness.bin", 1), obj.numpy())
        close("RPN deltas", raw("rpn_deltas.bin", 4), dl.numpy())
        props, _ = net.rpn(images, feats)
        mine = raw("proposals.bin", 4)
        ref = props[0].numpy()
        n = matched(ref, mine, 0.05)
        ok(len(mine) == len(ref) and n >= 0.98 * len(ref),
           "proposals: %d, torchvision %d, %d of them within 0.05 px" % (len(mine), len(ref), n))
        rh = net.roi_heads
        P_ = [torch.from_numpy(mine)]
        if stages > 1:
            dets, st = rh.forward_eval(feats, P_, images.image_sizes)
            cls, reg = st[0]["cls"], st[0]["reg"]
            boxes, scores, labels = [dets[0][0]], [dets[0][1]], [dets[0][2]]
        else:
            cls, reg = rh.box_predictor(rh.box_head(rh.box_roi_pool(feats, P_, images.image_sizes)))
        nb = 1 if stages > 1 else K + 1
        close("class logits on C's proposals", raw("class_logits.bin", K + 1), cls.numpy())
        close("box deltas on C's proposals", raw("box_deltas.bin", 4 * nb), reg.numpy())
        if stages == 1:
            boxes, scores, labels = rh.postprocess_detections(cls, reg, P_, images.image_sizes)
    det = raw("detections.bin", 6)
    ref = np.concatenate([boxes[0].numpy(), scores[0].numpy()[:, None],
                          labels[0].numpy()[:, None].astype(np.float32) - 1], axis=1)
    same = 0
    for r in ref:
        c = det[(det[:, 5] == r[5]) & (np.abs(det[:, 4] - r[4]) <= 1e-3)]
        same += matched(r[None, :4], c[:, :4], 0.05) if len(c) else 0
    ok(len(det) == len(ref) and same == len(ref),
       "detections: %d, torchvision %d, %d with the same class, score and box"
       % (len(det), len(ref), same))
    if mask and len(det) == 0:  # an export trained 2 steps scores below 0.05 everywhere
        ok(True, "masks: no detections to compare on (the default-init exports have MAXDET)")
    elif mask:
        from torchvision.models.detection.roi_heads import maskrcnn_inference
        with torch.no_grad():
            b = [torch.from_numpy(det[:, :4].copy())]
            lab = [torch.from_numpy(det[:, 5].astype(np.int64) + 1)]
            x = rh.mask_predictor(rh.mask_head(rh.mask_roi_pool(feats, b, images.image_sizes)))
            probs = maskrcnn_inference(x, lab)[0]
        close("masks of C's %d detections" % len(det), raw("mask_probs.bin", 784),
              probs.reshape(-1, 784).numpy())


def main():
    torch.set_num_threads(2)
    for d in sys.argv[1:]:
        print("# dir: %s" % d)
        sys.stdout.flush()
        check(d)
    return plan()


if __name__ == "__main__":
    sys.exit(main())
