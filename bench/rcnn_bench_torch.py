#!/usr/bin/python3
"""torchvision side of bench/rcnn_bench.sh: the training step of
bench/rcnn_bench.c on torchvision 0.14's FasterRCNN / MaskRCNN -- the whole
model(images, targets) as a training loop calls it, loss = the sum of its
loss dict, loss.backward() -- with torch.set_num_threads(T); forward and
backward timed separately, median of S steps after W warm-up steps.

    /usr/bin/python3 bench/rcnn_bench_torch.py [--acceptance] [--models faster,mask,cascade]
        [--depth 18] [--threads 2] [--steps 5] [--warmup 1] [--images 2] [--size 256]
        [--classes 80] [--width 64] [--fpn 256] [--freeze-at 2] [--box-head 1024]
        [--box-batch 512] [--mask-head 256] [--rpn-pre 2000] [--rpn-post 2000] [--sgd]
        [--weights PREFIX]

The same configuration as rcnn_bench.c flag for flag (--acceptance is its
-A: width 16, FPN 32, nothing frozen, box head 256, 128 RoIs, mask head 16,
RPN 320 / 320, 8 images of 128x128; other flags override either preset):

  * backbone: resnet_fpn_backbone (FrozenBatchNorm2d, trainable_layers =
    5 - freeze_at) at width 64 and FPN 256; at another width or FPN the
    same module tree built from gen_resnet.ResNetReplica (torchvision's
    ResNet with a width knob, the goldens' replica) with its BN replaced by
    FrozenBatchNorm2d, frozen the same way, in BackboneWithFPN +
    LastLevelMaxPool;
  * transform: min_size = max_size = size, image_mean 0, image_std 1, so
    GeneralizedRCNNTransform does not resize (it still runs its bilinear
    interpolate at scale 1 and copies into the batch: O(n 3 H W) work the
    C side does not do);
  * the RPN's and box head's counts as given (pre-NMS per level, post-NMS,
    256 anchors / 512 RoIs sampled per image by torchvision's random
    sampler); box head TwoMLPHead(F*49, box_head) + FastRCNNPredictor(K+1);
    mask head MaskRCNNHeads(F, (D,)*4) + MaskRCNNPredictor(D, D, K+1);
  * Cascade R-CNN: torchvision has none; its RoIHeads are replaced by
    tests/golden/cascade_ref.CascadeHeads (Detectron2's CascadeROIHeads
    semantics on torchvision's MultiScaleRoIAlign / TwoMLPHead, the
    reference tests/test_fasterrcnn checks the C cascade against: a real
    autograd training module, but the project's, not Detectron2's code);
  * inputs: rcnn_bench.c's -- the counter hash's images (gen_resnet.hash_fill
    "input", seed 1, +-0.25: ps_model_hash_fill's values), its three
    ground-truth boxes per image (labels 1..3 mod K) and the inscribed
    ellipses as masks;
  * --weights PREFIX: the weights rcnn_bench -o PREFIX wrote for this model
    and depth (PREFIX<model>-r<depth>.safetensors), loaded with
    strict=True, so both sides propose the same boxes (otherwise
    torchvision's own random init: NMS then keeps another number of
    proposals and the mask branch gets another number of positive RoIs).

Counts that depend on the weights (proposals after NMS, box head RoIs over
every stage, positive RoIs of the mask branch) come from forward hooks and
are printed per image as the mean over the timed steps; with --weights they
equal the C side's up to float rounding in NMS and the samplers' random
picks (torchvision's randperm here, the counter hash there: the same
counts, other RoIs).  --sgd adds an SGD
step (lr 1e-3, momentum 0.9) after the backward, timed apart (sgd_ms) and
not in step_ms (the C side has no optimizer in its step).  Lines starting
with RESULT are parsed by rcnn_bench.sh.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
import cascade_ref as C  # noqa: E402
import gen_fasterrcnn as GF  # noqa: E402
import gen_resnet as G  # noqa: E402

from torchvision.models.detection import FasterRCNN, MaskRCNN  # noqa: E402
from torchvision.models.detection.backbone_utils import (BackboneWithFPN,  # noqa: E402
                                                         resnet_fpn_backbone)
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead  # noqa: E402
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor  # noqa: E402
from torchvision.ops import MultiScaleRoIAlign  # noqa: E402
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool  # noqa: E402
from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: E402

TORCHVISION = dict(width=64, fpn=256, freeze_at=2, box_head=1024, box_batch=512, mask_head=256,
                   size=256, images=2, rpn_pre=2000, rpn_post=2000)
ACCEPTANCE = dict(width=16, fpn=32, freeze_at=0, box_head=256, box_batch=128, mask_head=16,
                  size=128, images=8, rpn_pre=320, rpn_post=320)
# rcnn_bench.c's g_gt: fractions of the side
GT = [(0.10, 0.10, 0.50, 0.45), (0.40, 0.30, 0.90, 0.95), (0.55, 0.05, 0.95, 0.40)]
TITLES = {"faster": "Faster R-CNN", "mask": "Mask R-CNN", "cascade": "Cascade R-CNN"}


def frozen_bn(module):
    """every BatchNorm2d below module replaced by FrozenBatchNorm2d (identity
    statistics, as resnet_fpn_backbone's norm_layer gives)"""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, FrozenBatchNorm2d(child.num_features, child.eps))
        else:
            frozen_bn(child)
    return module


def backbone(a, depth):
    trainable = 5 - a.freeze_at
    if a.width == 64 and a.fpn == 256:
        return resnet_fpn_backbone(backbone_name="resnet%d" % depth, weights=None,
                                   trainable_layers=trainable)
    body = frozen_bn(G.ResNetReplica(depth, 1, a.width))
    train = ["layer4", "layer3", "layer2", "layer1", "conv1"][:trainable]
    for name, p in body.named_parameters():  # _resnet_fpn_extractor's rule
        if not any(name.startswith(t) for t in train):
            p.requires_grad_(False)
    c5 = body.inplanes
    return BackboneWithFPN(body, {"layer%d" % k: str(k - 1) for k in range(1, 5)},
                           [c5 // 8, c5 // 4, c5 // 2, c5], a.fpn, extra_blocks=LastLevelMaxPool())


class CascadeRoIHeads(C.CascadeHeads):
    """CascadeHeads behind GeneralizedRCNN's roi_heads call: training only,
    the summed losses (no detections: the transform returns them unchanged
    in training)"""

    def forward(self, features, proposals, image_sizes, targets=None):
        losses, _ = self.forward_train(features, proposals, image_sizes, targets)
        return [], {k: v for k, v in losses.items() if "stage" not in k}


def build(a, model, depth):
    K1 = a.classes + 1
    common = dict(min_size=a.size, max_size=a.size, image_mean=[0.0, 0.0, 0.0],
                  image_std=[1.0, 1.0, 1.0], rpn_pre_nms_top_n_train=a.rpn_pre,
                  rpn_post_nms_top_n_train=a.rpn_post, box_batch_size_per_image=a.box_batch,
                  box_head=TwoMLPHead(a.fpn * 49, a.box_head),
                  box_predictor=FastRCNNPredictor(a.box_head, K1))
    bb = backbone(a, depth)
    if model == "mask":
        D = a.mask_head
        net = MaskRCNN(bb, mask_head=MaskRCNNHeads(a.fpn, (D, D, D, D), 1),
                       mask_predictor=MaskRCNNPredictor(D, D, K1), **common)
    else:
        net = FasterRCNN(bb, **common)
    if model == "cascade":
        pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
        net.roi_heads = CascadeRoIHeads(pool, a.fpn, a.box_head, a.classes, net.roi_heads)
    return net


def ground_truth(a, masks):
    """rcnn_bench.c's: the GT boxes of every image, labels 1..3 mod K, and
    each box's inscribed ellipse (gen_fasterrcnn.gt_mask, the goldens')"""
    H = a.size
    out = []
    for _ in range(a.images):
        boxes = torch.tensor([[c * H for c in b] for b in GT], dtype=torch.float32)
        t = {"boxes": boxes,
             "labels": torch.tensor([j % a.classes + 1 for j in range(len(GT))])}
        if masks:
            t["masks"] = torch.stack([GF.gt_mask(b, H) for b in boxes.double().tolist()])
        out.append(t)
    return out


class Counter:
    """the weight-dependent work of a forward, from hooks: proposals (the
    RPN's output), box RoIs (every box_roi_pool call), mask RoIs"""

    def __init__(self, net):
        self.n = [0.0, 0.0, 0.0]
        self.on = False
        net.rpn.register_forward_hook(lambda m, i, o: self.add(0, o[0]))
        net.roi_heads.box_roi_pool.register_forward_hook(lambda m, i, o: self.add(1, i[1]))
        if getattr(net.roi_heads, "mask_roi_pool", None) is not None:
            net.roi_heads.mask_roi_pool.register_forward_hook(lambda m, i, o: self.add(2, i[1]))

    def add(self, k, boxes):
        if self.on:
            self.n[k] += sum(len(b) for b in boxes)


def load_weights(net, a, model, depth):
    """rcnn_bench -o's file for this model into net (strict); None or an
    error message"""
    path = "%s%s-r%d.safetensors" % (a.weights, model, depth)
    try:
        sd, _ = G.read_safetensors(path)
        net.load_state_dict(sd, strict=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        return "--weights: %s: %s" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__)
    return None


def bench(a, model, depth):
    torch.manual_seed(0)
    net = build(a, model, depth)
    if a.weights:
        err = load_weights(net, a, model, depth)
        if err:
            print("rcnn_bench_torch: %s" % err, file=sys.stderr)
            return 1
    net.train()
    count = Counter(net)
    opt = (torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1e-3,
                           momentum=0.9) if a.sgd else None)
    n, H = a.images, a.size
    x = torch.from_numpy(G.hash_fill(n * 3 * H * H, "input", 1, 0.25)).view(n, 3, H, H)
    images = list(x)
    targets = ground_truth(a, model == "mask")
    tf, tb, to = [], [], []
    loss = torch.zeros(())
    for st in range(-a.warmup, a.steps):
        net.zero_grad(set_to_none=True)
        count.on = st >= 0
        t0 = time.perf_counter()
        losses = net(images, targets)
        loss = sum(losses.values())
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if opt is not None:
            opt.step()
        t3 = time.perf_counter()
        if st >= 0:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
            to.append(t3 - t2)
    lv = loss.item()
    if not math.isfinite(lv):
        print("rcnn_bench_torch: %s ResNet-%d: the loss is not finite (%g)" % (model, depth, lv),
              file=sys.stderr)
        return 1
    steps = [f + b for f, b in zip(tf, tb)]
    mf, mb, ms = (statistics.median(v) for v in (tf, tb, steps))
    per = a.steps * a.images
    w = [x / per for x in count.n]
    print("%s-ResNet-%d-FPN (%s; width %d, FPN %d, freeze_at %d, box head %d, "
          "%d RoIs/image, mask head %d, RPN %d/%d) %dx3x%dx%d, K %d: fwd %.1f ms, bwd %.1f ms, "
          "step %.1f ms, %.2f images/s; per image %.0f proposals, %.0f box RoIs, %.1f mask RoIs "
          "(loss %.3f)" % (TITLES[model], depth,
                           ("torchvision + cascade_ref.py" if model == "cascade" else "torchvision")
                           + (", rcnn_bench's weights" if a.weights else ", own init"),
                           a.width, a.fpn, a.freeze_at, a.box_head, a.box_batch,
                           a.mask_head if model == "mask" else 0, a.rpn_pre, a.rpn_post,
                           a.images, a.size, a.size, a.classes, mf * 1e3, mb * 1e3, ms * 1e3,
                           a.images / ms, w[0], w[1], w[2], lv))
    print("RESULT impl=torch model=%s depth=%d width=%d fpn=%d size=%d batch=%d threads=%d "
          "fwd_ms=%.2f bwd_ms=%.2f step_ms=%.2f images_per_s=%.3f proposals=%.1f rois=%.1f "
          "mask_rois=%.1f init=%s loss=%.4f%s" % (
              model, depth, a.width, a.fpn, a.size, a.images, torch.get_num_threads(), mf * 1e3,
              mb * 1e3, ms * 1e3, a.images / ms, w[0], w[1], w[2],
              "shared" if a.weights else "own", lv,
              " sgd_ms=%.2f" % (statistics.median(to) * 1e3) if opt is not None else ""))
    sys.stdout.flush()
    return 0


def blas_loaded():
    """the BLAS libraries mapped into this process (Debian's torch says
    BLAS_INFO=generic and takes whichever libblas the alternatives pick)"""
    try:
        with open("/proc/self/maps") as f:
            libs = {os.path.basename(ln.split()[-1]) for ln in f
                    if "blas" in ln.lower() and ".so" in ln}
        return ", ".join(sorted(libs)) or "none mapped"
    except OSError:
        return "unknown"


def kernels():
    """what ran: PyTorch's version, BLAS and oneDNN as its build reports
    them, and the BLAS library actually loaded"""
    cfg = torch.__config__.show()
    blas = [ln.split("BLAS_INFO=")[1].split(",")[0] for ln in cfg.splitlines()
            if "BLAS_INFO=" in ln]
    cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    isa = cap() if cap else os.environ.get("ATEN_CPU_CAPABILITY", "default (best the CPU has)")
    return ("kernels: PyTorch %s, %d threads, BLAS %s (loaded: %s), oneDNN (mkldnn) %s, "
            "CPU capability %s"
            % (torch.__version__, torch.get_num_threads(), blas[0] if blas else "unknown",
               blas_loaded(),
               "on" if torch.backends.mkldnn.is_available() else "off", isa))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--acceptance", action="store_true")
    p.add_argument("--models", default="faster,mask,cascade")
    p.add_argument("--depth", type=int, default=18, choices=(0, 18, 34, 50))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--sgd", action="store_true")
    p.add_argument("--weights", metavar="PREFIX", default=None)
    for k in TORCHVISION:
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    a = p.parse_args()
    for k, v in (ACCEPTANCE if a.acceptance else TORCHVISION).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    bad = [m for m in a.models.split(",") if m not in TITLES]
    if bad:
        p.error("--models: unknown model %s (faster, mask, cascade)" % ", ".join(bad))
    if a.size % 64 or a.size < 64:
        p.error("--size %d: the side must be a multiple of 64 (as rcnn_bench.c's)" % a.size)
    if a.steps < 1 or a.warmup < 0 or a.threads < 1 or a.images < 1 or a.classes < 1:
        p.error("--steps, --threads, --images, --classes must be >= 1, --warmup >= 0")
    torch.set_num_threads(a.threads)
    rc = 0
    for depth in ((18, 50) if a.depth == 0 else (a.depth,)):
        for m in a.models.split(","):
            rc |= bench(a, m, depth)
    print(kernels())  # after the runs: the BLAS library is mapped by then
    return rc


if __name__ == "__main__":
    sys.exit(main())
