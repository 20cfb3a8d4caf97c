#!/usr/bin/python3
"""Golden files for tests/test_resnet.c and tests/test_model_io.c.

Run once with Debian's interpreter (python3-torch, python3-torchvision):
    /usr/bin/python3 tests/golden/gen_resnet.py tests/golden

The weights and inputs of the whole-model comparisons are NOT stored: both
sides compute them from a counter hash (ps_model_init() / ps_model_hash_fill()
in worker/models/resnet_params.c, reproduced bit for bit below), so only the
small results are committed: logits, loss, and for every parameter gradient
its L2 norm plus a deterministic sample of elements (llm.c's debug-state
approach without the 47 MB of weights).

Also written: a PyTorch-written state dict (random torch init, width-8
ResNet-18 so it stays small) in safetensors, with the logits PyTorch gives for
the hash input, for the "PyTorch -> C" direction of the interop test.

This file doubles as a module for tests/tools/check_model_torch.py (hash, model
construction, safetensors by hand).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

M64 = (1 << 64) - 1


# ---- the counter hash (ps_engine.h ps_rng_uniform, resnet_params.c) --------

def fnv1a64(s):
    h = 0xcbf29ce484222325
    for ch in s.encode():
        h ^= ch
        h = (h * 0x100000001b3) & M64
    return h


def rng_u24(seed, n):
    """(z >> 40) for indices 0..n-1: ps_rng_uniform(seed, i) * 2^24."""
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z >> np.uint64(40)


def rng_uniform(seed, n):
    return rng_u24(seed, n).astype(np.float64) / 16777216.0


def hash_fill(n, name, seed, scale):
    """ps_model_hash_fill: (2u-1)*scale in double, rounded to float."""
    u = rng_uniform((seed ^ fnv1a64(name)) & M64, n)
    return ((2.0 * u - 1.0) * scale).astype(np.float32)


def fill_offset(n, name, seed, lo, scale):
    u = rng_uniform((seed ^ fnv1a64(name)) & M64, n)
    return (lo + scale * u).astype(np.float32)


SAMPLE_SALT = 0x5A4D504C45


def sample_indices(name, numel, count):
    """Indices of the gradient sample: ((u24 * numel) >> 24)."""
    k = rng_u24((fnv1a64(name) ^ SAMPLE_SALT) & M64, count)
    return [int((int(x) * numel) >> 24) for x in k]


# ---- models -----------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + idt)


class ResNetReplica(nn.Module):
    """torchvision.models.ResNet's module tree (same state-dict names) with a
    width knob, for small PyTorch-written files and for machines without
    torchvision.  main() checks it against torchvision when that is present."""

    def __init__(self, depth, num_classes, width=64):
        super().__init__()
        block = Bottleneck if depth == 50 else BasicBlock
        layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}[depth]
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        for s in range(4):
            setattr(self, "layer%d" % (s + 1),
                    self._make_layer(block, width << s, layers[s], 1 if s == 0 else 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear((width << 3) * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride):
        ds = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            ds = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride,
                                         bias=False), nn.BatchNorm2d(planes * block.expansion))
        out = [block(self.inplanes, planes, stride, ds)]
        self.inplanes = planes * block.expansion
        out += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*out)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def torchvision_resnet(depth, num_classes):
    try:
        import torchvision
    except ImportError:
        return None
    return getattr(torchvision.models, "resnet%d" % depth)(num_classes=num_classes)


class TemporalShift(nn.Module):
    """TSM's TemporalShift (ops/temporal_shift.py), wrapping a conv."""

    def __init__(self, net, n_segment, n_div):
        super().__init__()
        self.net, self.n_segment, self.fold_div = net, n_segment, n_div

    def forward(self, x):
        return self.net(tsm_shift(x, self.n_segment, self.fold_div))


def tsm_shift(x, n_segment, fold_div):
    nt, c, h, w = x.size()
    x = x.view(nt // n_segment, n_segment, c, h, w)
    fold = c // fold_div
    out = torch.zeros_like(x)
    out[:, :-1, :fold] = x[:, 1:, :fold]
    out[:, 1:, fold:2 * fold] = x[:, :-1, fold:2 * fold]
    out[:, :, 2 * fold:] = x[:, :, 2 * fold:]
    return out.view(nt, c, h, w)


def make_temporal_shift(net, n_segment, n_div):
    """TSM's make_temporal_shift(place='blockres'), n_round rule included."""
    n_round = 2 if len(list(net.layer3.children())) >= 23 else 1
    for s in range(1, 5):
        for i, b in enumerate(getattr(net, "layer%d" % s).children()):
            if i % n_round == 0:
                b.conv1 = TemporalShift(b.conv1, n_segment, n_div)


def sd_key(k):
    """State-dict name with TSM's wrapper level removed."""
    return k.replace(".conv1.net.", ".conv1.")


def build(depth, num_classes, width=64, shift=True, n_segment=8, shift_div=8, replica=False):
    net = None if (replica or width != 64) else torchvision_resnet(depth, num_classes)
    if net is None:
        net = ResNetReplica(depth, num_classes, width)
    if shift:
        make_temporal_shift(net, n_segment, shift_div)
    return net


def hash_init(net, seed, random_bn):
    """ps_model_init(m, seed, random_bn) on a torch model."""
    sd = net.state_dict()
    with torch.no_grad():
        for k, t in sd.items():
            name = sd_key(k)
            n = t.numel()
            if name.endswith("num_batches_tracked"):
                t.zero_()
                continue
            if name.startswith("fc."):
                v = hash_fill(n, name, seed, 1.0 / math.sqrt(net.fc.in_features))
            elif t.dim() == 4:
                fan_out = t.shape[0] * t.shape[2] * t.shape[3]
                v = hash_fill(n, name, seed, math.sqrt(6.0 / fan_out))
            elif name.endswith(".weight") or name.endswith("running_var"):
                v = fill_offset(n, name, seed, 0.5, 1.0) if random_bn else \
                    np.ones(n, np.float32)
            else:  # bias, running_mean
                v = hash_fill(n, name, seed, 0.25) if random_bn else np.zeros(n, np.float32)
            t.copy_(torch.from_numpy(v).view(t.shape))


def partial_bn(net):
    """TSM's partialBN: every BN but the first in eval mode, affine frozen."""
    count = 0
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            count += 1
            if count >= 2:
                m.eval()
                m.weight.requires_grad_(False)
                m.bias.requires_grad_(False)


def hash_input(nclips, T, H, W, seed):
    x = hash_fill(nclips * T * 3 * H * W, "input", seed, 1.0)
    return torch.from_numpy(x).view(nclips * T, 3, H, W)


def labels_for(nclips, K):
    return torch.tensor([(b * 7 + 3) % K for b in range(nclips)], dtype=torch.long)


def tsm_forward(net, x, nclips, T):
    """TSM head: fc on every frame, mean over the segments (dropout 0)."""
    lf = net(x)
    return lf.view(nclips, T, -1).mean(1)


# ---- safetensors by hand (the `safetensors` package is optional) -------------

DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "F16": np.float16}


def write_safetensors(path, tensors, meta=None):
    """tensors: dict name -> numpy array, written in sorted name order."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64",
              np.dtype(np.float16): "F16", np.dtype(np.float64): "F64"}[a.dtype]
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    meta = header.pop("__metadata__", {})
    body = data[8 + hl:]
    out = {}
    for name, info in header.items():
        s, e = info["data_offsets"]
        a = np.frombuffer(body[s:e], dtype=np.dtype(DT[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(a.astype(DT[info["dtype"]]).reshape(info["shape"]))
    return out, meta


def state_dict_numpy(net):
    return {sd_key(k): v.detach().cpu().numpy() for k, v in net.state_dict().items()}


# ---- goldens ------------------------------------------------------------------

VARIANTS = [
    # name, depth, shift, partial_bn, clips, H, K, samples, dropout
    ("r18_tsm", 18, True, False, 2, 64, 10, 64, 0.0),
    ("r18_tsn", 18, False, False, 1, 32, 5, 32, 0.5),
    ("r18_tsm_pbn", 18, True, True, 1, 32, 5, 32, 0.0),
    ("r50_tsm_pbn", 50, True, True, 1, 32, 10, 32, 0.0),
]
DROPOUT_SEED = 42
SEED = 1234
T = 8


def dropout_mask(n, p, seed, forward_index=0):
    """The engine's dropout mask for forward number forward_index after
    ps_model_set_seed(m, seed): keep where ps_rng_uniform(s, i) >= p with
    s = seed ^ (0x9E3779B97F4A7C15 * (forward_index + 1))."""
    s = (seed ^ ((0x9E3779B97F4A7C15 * (forward_index + 1)) & M64)) & M64
    return torch.from_numpy(rng_uniform(s, n) >= p)


def run_variant(depth, shift, pbn, clips, H, K, dtype, dropout=0.0):
    torch.manual_seed(0)
    net = build(depth, K, shift=shift)
    hash_init(net, SEED, True)
    net.to(dtype)
    net.train()
    if pbn:
        partial_bn(net)
    if dropout > 0:
        # TSM's head: dropout on the pooled features, then fc
        n = clips * T * net.fc.in_features
        keep = dropout_mask(n, dropout, DROPOUT_SEED).view(clips * T, -1).to(dtype)
        scale = 1.0 / (1.0 - dropout)
        net.fc.register_forward_pre_hook(lambda mod, inp: (inp[0] * keep * scale,))
    x = hash_input(clips, T, H, H, SEED).to(dtype)
    y = labels_for(clips, K)
    logits = tsm_forward(net, x, clips, T)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    grads = {sd_key(k): (p.grad.flatten().double() if p.grad is not None
                         else torch.zeros(p.numel(), dtype=torch.float64))
             for k, p in net.named_parameters()}
    bufs = {sd_key(k): b.flatten().double() for k, b in net.named_buffers()}
    return loss.item(), logits.detach().double().flatten(), grads, bufs


def gen_variant(outdir, name, depth, shift, pbn, clips, H, K, nsamp, dropout):
    """The reference is PyTorch in float64 (same fp32 weights and input).
    PyTorch's own float32 run gives each tensor's noise floor: the largest
    and the 90th-percentile |g32 - g64| / rms(g64), and the relative error
    of the norm.  Gradients are discontinuous where a ReLU or max-pool
    decision flips between float32 and float64 (a pre-activation within
    rounding of 0), and training-mode BN spreads such a flip over its
    channel, so test_resnet.c judges elements by a majority rule on top of
    these floors (see there)."""
    loss, logits, grads, bufs = run_variant(depth, shift, pbn, clips, H, K, torch.float64,
                                            dropout)
    _, _, g32, _ = run_variant(depth, shift, pbn, clips, H, K, torch.float32, dropout)
    lines = ["# %s: ResNet-%d %s partial_bn=%d clips=%d T=%d %dx%d K=%d seed=%d dropout=%g "
             "(mask seed %d)" % (name, depth, "TSM" if shift else "TSN", pbn, clips, T, H, H, K,
                                 SEED, dropout, DROPOUT_SEED),
             "# reference: PyTorch float64; grad NAME NUMEL NORM NOISE_MAX NOISE_P90 "
             "NOISE_NORM IDX:VAL...",
             "loss %.12g" % loss,
             "logits %d %s" % (logits.numel(), " ".join("%.9g" % v for v in logits.tolist()))]
    for k, g in grads.items():
        n = g.norm().item()
        rms = n / math.sqrt(g.numel())
        e32 = (g32[k] - g).abs() / rms if rms > 0 else torch.zeros(1, dtype=torch.float64)
        ne = e32.max().item()
        np90 = torch.quantile(e32.float(), 0.9).item()
        nn_ = (abs(g32[k].norm().item() - n) / n) if n > 0 else 0.0
        idx = sample_indices(k, g.numel(), nsamp)
        lines.append("grad %s %d %.12g %.3g %.3g %.3g %s" % (
            k, g.numel(), n, ne, np90, nn_, " ".join("%d:%.9g" % (i, g[i].item()) for i in idx)))
    for k, b in bufs.items():
        if k.endswith("num_batches_tracked"):
            lines.append("count %s %d" % (k, int(b.item())))
        else:
            idx = sample_indices(k, b.numel(), 8)
            lines.append("buf %s %d %s" % (k, b.numel(),
                         " ".join("%d:%.9g" % (i, b[i].item()) for i in idx)))
    with open(os.path.join(outdir, "resnet_%s.txt" % name), "w") as f:
        f.write("\n".join(lines) + "\n")
    worst = max(((g32[k] - g).abs().max().item() * math.sqrt(g.numel()) / max(g.norm().item(), 1e-30))
                for k, g in grads.items())
    print("%s: loss %.6f, PyTorch fp32-vs-fp64 worst gradient error %.3g rms" % (name, loss, worst))


def gen_pytorch_file(outdir):
    """A state dict written by PyTorch (torch's own random init and a few
    training-mode batches so the BN statistics are not trivial)."""
    torch.manual_seed(7)
    K, H, clips = 7, 32, 1
    net = build(18, K, width=8, shift=True, replica=True)
    net.train()
    with torch.no_grad():
        for i in range(3):
            net(torch.randn(clips * T, 3, H, H))
    net.eval()
    x = hash_input(clips, T, H, H, SEED)
    with torch.no_grad():
        logits = tsm_forward(net, x, clips, T)
    write_safetensors(os.path.join(outdir, "torch_r18w8.safetensors"), state_dict_numpy(net),
                      {"format": "pt"})
    with open(os.path.join(outdir, "torch_r18w8.txt"), "w") as f:
        f.write("# ResNet-18 width 8 TSM, K=7, eval logits of hash_input(1, 8, 32, 32, %d)\n"
                % SEED)
        f.write("logits %d %s\n" % (logits.numel(),
                " ".join("%.9g" % v for v in logits.flatten().tolist())))


def check_replica():
    """The replica must be torchvision's tree: same names, shapes, outputs."""
    for depth in (18, 50):
        tv = torchvision_resnet(depth, 10)
        if tv is None:
            print("torchvision missing: replica not cross-checked")
            return
        rp = ResNetReplica(depth, 10)
        a, b = tv.state_dict(), rp.state_dict()
        assert list(a) == list(b), "replica names differ from torchvision"
        assert all(a[k].shape == b[k].shape for k in a)
        rp.load_state_dict(a, strict=True)
        tv.eval()
        rp.eval()
        x = torch.randn(2, 3, 32, 32)
        assert torch.allclose(tv(x), rp(x), atol=1e-5, rtol=1e-4)
    print("replica == torchvision")


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.set_num_threads(2)
    check_replica()
    for v in VARIANTS:
        gen_variant(outdir, *v)
    gen_pytorch_file(outdir)


if __name__ == "__main__":
    main()
