#!/usr/bin/python3
"""PyTorch side of bench/engine_bench.sh: the same training step as
bench/engine_bench.c -- TSM-ResNet-18/-50 (residual shift 1/8 each way,
partial BN, dropout 0.5 before fc, 400 classes, mean over 8 segments), or
a 3-D model (torchvision.models.video's r3d_18 / mc3_18 / r2plus1d_18, the
I3D-ResNet-50 of tests/golden/gen_video3d.py; BN in training mode, dropout
0.5 before I3D's fc), 2 clips x 8 frames at 112x112, forward (+ loss) and
backward timed separately, median of N steps -- with
torch.set_num_threads(T).

    /usr/bin/python3 bench/engine_bench_torch.py [--threads 2] [--steps 10]
        [--warmup 2] [--clips 2] [--size 112] [--frames 8] [--depth 0]
        [--models tsm-r18,tsm-r50,r3d-18,i3d-r50-311,...] [--autocast]

--autocast: the forward under torch.autocast("cpu", dtype=torch.bfloat16)
(PyTorch's CPU mixed precision: bf16 convolutions and matmuls, fp32
weights), the counterpart of the engine's -P bf16.

Also times a 2048^3 sgemm (torch.mm) as PyTorch's GEMM peak.  FLOPs are
counted from the conv / linear shapes by forward hooks (2 per multiply-add;
backward = 2x forward except the stem's missing input gradient), the same
rule as ps_model_flops().  Lines starting with RESULT are parsed by
engine_bench.sh.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# The TSM model pieces (shift, blockres placement with TSM's n_round rule,
# partial BN, the ResNet replica for machines without torchvision) are
# tests/golden/gen_resnet.py's, the ones the whole-model goldens check.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "golden"))
import gen_resnet as G  # noqa: E402
import gen_video3d as V  # noqa: E402

partial_bn = G.partial_bn


def resnet(depth, num_classes):
    net = G.torchvision_resnet(depth, num_classes)
    if net is not None:
        return net, "torchvision"
    return G.ResNetReplica(depth, num_classes), "replica (no torchvision)"


def build_tsm(depth, num_classes=400, n_segment=8, dropout=0.5):
    net, src = resnet(depth, num_classes)
    G.make_temporal_shift(net, n_segment, 8)
    net.fc = nn.Sequential(nn.Dropout(dropout), net.fc)
    return net, src


def build_3d(arch, num_classes=400):
    if arch in V.TV_BUILDERS:
        net = V.torchvision_video(arch, num_classes)
        if net is not None:
            return net, "torchvision.models.video"
        return V.build(arch, num_classes), "replica (no torchvision)"
    return V.build(arch, num_classes, dropout=0.5), "tests/golden/gen_video3d.py"


def count_flops(net, x):
    """Forward FLOPs of convs and linears; backward from the same rule."""
    fl = {"f": 0.0, "b": 0.0}
    first = {"seen": False}

    def conv_hook(m, inp, out):
        k = 1
        for e in m.kernel_size:
            k *= e
        f = 2.0 * out.numel() * (m.in_channels // m.groups) * k
        fl["f"] += f
        fl["b"] += f if not first["seen"] else 2 * f
        first["seen"] = True

    def lin_hook(m, inp, out):
        f = 2.0 * out.numel() * m.in_features
        fl["f"] += f
        fl["b"] += 2 * f

    hs = [m.register_forward_hook(conv_hook) for m in net.modules()
          if isinstance(m, (nn.Conv2d, nn.Conv3d))]
    hs += [m.register_forward_hook(lin_hook) for m in net.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        net(x)
    for h in hs:
        h.remove()
    return fl["f"], fl["b"]


def sgemm_peak(n=2048, reps=3):
    a, b = torch.rand(n, n), torch.rand(n, n)
    torch.mm(a, b)
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best * 1e-9


def bench(name, clips, T, size, steps, warmup, peak, autocast=False):
    torch.manual_seed(1)
    tsm = name.startswith("tsm-r")
    if tsm:
        net, src = build_tsm(int(name[5:]), n_segment=T)
        x = torch.rand(clips * T, 3, size, size) * 2 - 1
    else:
        net, src = build_3d(name)
        x = torch.rand(clips, 3, T, size, size) * 2 - 1

    def train_mode():
        net.train()
        if tsm:
            partial_bn(net)

    def logits_of(out):
        return out.view(clips, T, -1).mean(1) if tsm else out

    y = torch.arange(clips) % 400
    fl_f, fl_b = count_flops(net, x)
    train_mode()
    tf, tb, ts = [], [], []
    loss = None
    for s in range(-warmup, steps):
        net.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = logits_of(net(x))
        loss = F.cross_entropy(logits.float(), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if s >= 0:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
            ts.append(t2 - t0)
    mf, mb, ms = statistics.median(tf), statistics.median(tb), statistics.median(ts)
    gf = (fl_f + fl_b) / ms * 1e-9
    prec = "bf16-autocast" if autocast else "fp32"
    print("%s (%s, %s) %dx%dx3x%dx%d: fwd %.1f ms, bwd %.1f ms, step %.1f ms, "
          "%.2f clips/s, %.1f GFLOP/step, %.1f GFLOP/s (%.0f%% of torch.mm peak), loss %.3f"
          % (name, src, prec, clips, T, size, size, mf * 1e3, mb * 1e3, ms * 1e3, clips / ms,
             (fl_f + fl_b) * 1e-9, gf, 100 * gf / peak, loss.item()))
    print("RESULT impl=torch prec=%s model=%s fwd_ms=%.2f bwd_ms=%.2f step_ms=%.2f "
          "clips_per_s=%.3f gflop_step=%.3f gflops=%.2f"
          % ("bf16" if autocast else "fp32", name, mf * 1e3, mb * 1e3, ms * 1e3, clips / ms,
             (fl_f + fl_b) * 1e-9, gf))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--clips", type=int, default=2)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--depth", type=int, default=0, help="0 = 18 and 50 (TSM)")
    ap.add_argument("--models", default="", help="comma list (tsm-r18, r3d-18, i3d-r50-311, ...)")
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast (CPU mixed precision)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    peak = sgemm_peak()
    print("PyTorch %s, %d threads, oneDNN %s; torch.mm 2048^3 %.1f GFLOP/s"
          % (torch.__version__, torch.get_num_threads(),
             torch.backends.mkldnn.is_available(), peak))
    print("RESULT impl=torch sgemm_gflops=%.2f threads=%d" % (peak, torch.get_num_threads()))
    models = (a.models.split(",") if a.models
              else ["tsm-r%d" % d for d in ([18, 50] if a.depth == 0 else [a.depth])])
    for name in models:
        bench(name, a.clips, a.frames, a.size, a.steps, a.warmup, peak, a.autocast)


if __name__ == "__main__":
    main()
