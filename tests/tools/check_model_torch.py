#!/usr/bin/python3
"""C-written checkpoints into PyTorch (run by tests/check_model_torch.sh).

For each directory written by tests/tools/model_export: load model.safetensors
into torchvision.models.resnetXX(num_classes=K) with
load_state_dict(strict=True) -- the interop promise -- then wrap the
blocks' conv1 with TSM's TemporalShift when the model is TSM, run the same
hash-generated input, and compare the logits with the C engine's in eval
mode and in training mode (batch-statistics BN); after the training forward
the BN running statistics and counts must match model_after.safetensors.

TAP on stdout; exit 77 when torch is missing.  Without torchvision the
structural replica in tests/golden/gen_resnet.py stands in (said in a
diagnostic), since Debian's python3-torchvision is optional.

Tolerances: float32 on both sides with different summation orders; the
logits pass through ~20-50 layers: |c - t| <= 1e-4 + 1e-3*|t|.  Running
statistics: 1e-4 + 1e-3*|t| (one update from batch statistics that in
layer4 of a ResNet-50 at 32x32 are taken over only 8 values).
"""
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))  # the golden generators
sys.path.insert(0, os.path.join(_here, "..", "lib"))     # taplib
import gen_resnet as G  # noqa: E402
from taplib import ok, plan  # noqa: E402

def close(got, want, atol, rtol):
    d = (got - want).abs()
    lim = atol + rtol * want.abs()
    bad = (d > lim)
    return (not bool(bad.any())), "worst |diff| %.3g (ref %.3g)" % (
        d.max().item(), want.abs().max().item())


def check(d):
    depth, shift, K, clips, H, seed = map(int, open(os.path.join(d, "config.txt")).read().split())
    tag = "%s-ResNet-%d" % ("TSM" if shift else "TSN", depth)
    T = 8
    net = G.torchvision_resnet(depth, K)
    if net is None:
        print("# torchvision not importable: using the replica of its module tree")
        net = G.ResNetReplica(depth, K)
    sd, meta = G.read_safetensors(os.path.join(d, "model.safetensors"))
    ok(meta.get("format") == "pt", "%s: metadata format=pt" % tag)
    ok(sd["bn1.num_batches_tracked"].dtype == torch.int64 and
       sd["bn1.num_batches_tracked"].dim() == 0,
       "%s: num_batches_tracked is a 0-dim int64" % tag)
    try:
        res = net.load_state_dict(sd, strict=True)
        ok(not res.missing_keys and not res.unexpected_keys,
           "%s: load_state_dict(strict=True) into torchvision" % tag)
    except RuntimeError as e:
        ok(False, "%s: load_state_dict(strict=True) into torchvision" % tag,
           str(e).replace("\n", " ")[:400])
        return
    if shift:
        G.make_temporal_shift(net, T, 8)
    x = G.hash_input(clips, T, H, H, seed)

    net.eval()
    with torch.no_grad():
        lt = G.tsm_forward(net, x, clips, T)
    lc = torch.from_numpy(np.fromfile(os.path.join(d, "logits_eval.bin"), dtype=np.float32))
    good, msg = close(lc.view_as(lt), lt, 1e-4, 1e-3)
    ok(good, "%s: eval logits equal PyTorch's" % tag, msg)

    net.train()
    with torch.no_grad():
        lt = G.tsm_forward(net, x, clips, T)
    lc = torch.from_numpy(np.fromfile(os.path.join(d, "logits_train.bin"), dtype=np.float32))
    good, msg = close(lc.view_as(lt), lt, 1e-4, 1e-3)
    ok(good, "%s: training-mode logits equal PyTorch's" % tag, msg)

    after, _ = G.read_safetensors(os.path.join(d, "model_after.safetensors"))
    tsd = {G.sd_key(k): v for k, v in net.state_dict().items()}
    worst, bad, counts = 0.0, [], 0
    for k, v in tsd.items():
        if k.endswith("num_batches_tracked"):
            counts += int(after[k].item() == v.item() == 1)
            continue
        if "running" not in k:
            continue
        good, msg = close(after[k].double(), v.double(), 1e-4, 1e-3)
        if not good:
            bad.append("%s: %s" % (k, msg))
    nbn = sum(1 for k in tsd if k.endswith("num_batches_tracked"))
    ok(not bad, "%s: BN running statistics after one training forward match" % tag,
       "; ".join(bad[:3]))
    ok(counts == nbn, "%s: all %d num_batches_tracked are 1" % (tag, nbn))


def check_convert(tmp, exe):
    """PyTorch -> C through worker/models/torch2safetensors.py: a TSM-style
    checkpoint ({"state_dict"}, "module.base_model." prefixes, TemporalShift's
    ".net.", "new_fc") of a torch-initialised TSM-ResNet-18 with trained-ish
    BN statistics, converted and loaded by the engine, gives PyTorch's eval
    logits."""
    import subprocess
    T, K, clips, H = 8, 6, 1, 32
    torch.manual_seed(3)
    net = G.build(18, K, shift=True)
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(clips * T, 3, H, H))
    net.eval()
    x = G.hash_input(clips, T, H, H, 1234)
    with torch.no_grad():
        lt = G.tsm_forward(net, x, clips, T)
    sd = {}
    for k, v in net.state_dict().items():
        k = "module.base_model." + k
        sd[k.replace("module.base_model.fc.", "module.new_fc.")] = v
    pth = os.path.join(tmp, "tsm_ckpt.pth")
    torch.save({"epoch": 1, "state_dict": sd}, pth)
    st = os.path.join(tmp, "tsm_ckpt.safetensors")
    conv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                        "models", "torch2safetensors.py")
    r = subprocess.run([sys.executable, conv, pth, st], capture_output=True, text=True)
    ok(r.returncode == 0, "torch2safetensors converts a TSM-style checkpoint", r.stderr[-300:])
    out = os.path.join(tmp, "loaded")
    r = subprocess.run([exe, "--load", st, out, "18", "1", str(K), str(clips), str(H)],
                       capture_output=True, text=True)
    ok(r.returncode == 0, "the engine loads the converted checkpoint", r.stderr[-300:])
    if r.returncode:
        return
    lc = torch.from_numpy(np.fromfile(os.path.join(out, "logits_eval.bin"), dtype=np.float32))
    good, msg = close(lc.view_as(lt), lt, 1e-4, 1e-3)
    ok(good, "converted TSM checkpoint: eval logits equal PyTorch's", msg)


def main():
    torch.set_num_threads(2)
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--convert":
        tmp, exe = args[1], args[2]
        args = args[3:]
        check_convert(tmp, exe)
    for d in args:
        check(d)
    sys.exit(plan())


if __name__ == "__main__":
    main()
