#!/usr/bin/python3
"""Official TSM checkpoints into psworker (run by tests/check_tsm_import.sh;
TAP; exit 77 without torch / torchvision / PIL).

PyTorch builds TSM in the official repository's module layout
(tests/golden/gen_tsm_official.py: TSN wrapper with base_model / new_fc,
TemporalShift's .net level, place 'blockres' or 'block', shift_div) and
saves checkpoints the way its main.py does, named the way its release files
are; worker/models/torch2safetensors.py converts them.  Then:
  A  blockres, 1/8, dropout 0.5 (new_fc), DataParallel names "module.*";
  B  block, 1/4, dropout 0 (base_model.fc), plain names "base_model.*":
     tests/tools/weights_eval (the engine, strict load) gives PyTorch's eval
     logits within 1e-4 + 1e-3*|t| and PyTorch's eval-mode weight gradients
     within 1e-3 relative (L2, per tensor); the converter recorded shift_div,
     place and segments from the file name; B through psworker --eval
     without --shift-place / --shift-div (taken from the file) gives
     PyTorch's logits on TSM's test pipeline (tests/lib/video_ref.py).
  Controls that show the comparison can fail: B with shift_div 8 misses
     the tolerance; B into a 'blockres' model is refused naming the place;
     --shift-place blockres on B is a usage error.
  Bad files: an unknown tensor (a non-local block's weight) and a wrong
     shape are refused naming the tensor; fine-tuning A to 4 classes lists
     the re-initialised classifier in the log; a random-weight torchvision
     resnet18 (ImageNet layout, 1000 classes) starts a 4-class TSM whose
     log lists fc as re-initialised.
"""
import argparse
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchvision
    from PIL import Image  # noqa: F401  (video_ref)
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))
sys.path.insert(0, os.path.join(_here, "..", "lib"))
import gen_resnet as G  # noqa: E402
import gen_tsm_official as O  # noqa: E402
import video_ref as V  # noqa: E402
from taplib import ok, plan  # noqa: E402

K, T, H, CLIPS, WIDTH = 5, 4, 32, 2, 8
CONV = os.path.join(_here, "..", "..", "worker", "models", "torch2safetensors.py")
sys.path.insert(0, os.path.dirname(CONV))
import torch2safetensors as T2S  # noqa: E402


def run(args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def close(c, t, atol=1e-4, rtol=1e-3):
    d = (c - t).abs()
    bad = d > atol + rtol * t.abs()
    return not bool(bad.any()), "worst |diff| %.3g (values up to %.3g)" % (
        d.max().item(), t.abs().max().item())


def our_name(k):
    """The official name in ours (an independent statement of the map)."""
    for p in ("module.", "base_model."):
        if k.startswith(p):
            k = k[len(p):]
    k = k.replace(".net.", ".")
    return "fc." + k[len("new_fc."):] if k.startswith("new_fc.") else k


def convert(pth, st):
    """worker/models/torch2safetensors.py's main, in this process (one torch
    import for the whole check)."""
    argv, sys.argv = sys.argv, [CONV, pth, st]
    try:
        T2S.main()
        rc = 0
    except SystemExit as e:
        rc = e.code or 0
    finally:
        sys.argv = argv
    ok(rc == 0, "torch2safetensors converts %s" % os.path.basename(pth))
    return G.read_safetensors(st)


def engine(a, st, out, place, div):
    return run([a.weights_eval, st, out, 18, 1, place, div, K, CLIPS, T, H, WIDTH])


def check_case(a, tag, place, div, dropout, dp):
    net = O.build(K, T, place, div, dropout, WIDTH)
    name = "TSM_gen_RGB_resnet18_shift%d_%s_avg_segment%d_e1.pth" % (div, place, T)
    pth = os.path.join(a.tmp, name)
    torch.save(O.checkpoint(net, dp), pth)
    st = pth.replace(".pth", ".safetensors")
    sd, meta = convert(pth, st)
    ok(meta.get("tsm.shift_div") == str(div) and meta.get("tsm.shift_place") == place and
       meta.get("tsm.n_segment") == str(T) and any(k.startswith("module." if dp else "base_model.")
                                                 for k in sd),
       "%s: names kept, TSM's options from the file name in the metadata: %s" % (tag, meta))
    x = G.hash_input(CLIPS, T, H, H, G.SEED)
    y = torch.tensor([(b * 7 + 3) % K for b in range(CLIPS)])
    net.zero_grad()
    lt = net(x)
    F.cross_entropy(lt, y).backward()
    out = os.path.join(a.tmp, tag)
    rc, msg = engine(a, st, out, place, div)
    ok(rc == 0, "%s: the engine loads the checkpoint strictly (place %s, 1/%d)" % (tag, place, div),
       msg[-300:])
    if rc:
        return st
    lc = torch.from_numpy(np.fromfile(os.path.join(out, "logits.bin"), np.float32)).view(CLIPS, K)
    good, m = close(lc, lt.detach())
    ok(good, "%s: eval logits == PyTorch's official-layout TSM: %s" % (tag, m))
    grads = {our_name(k): p.grad for k, p in net.named_parameters() if p.grad is not None}
    flat = np.fromfile(os.path.join(out, "grads.bin"), np.float32)
    off, worst, bad = 0, 0.0, []
    for line in open(os.path.join(out, "grads.txt")):
        n, numel = line.split()[0], int(line.split()[1])
        gc = torch.from_numpy(flat[off:off + numel].copy()).double()
        off += numel
        gt = grads[n].flatten().double()
        rel = ((gc - gt).norm() / max(gt.norm().item(), 1e-30)).item()
        worst = max(worst, rel)
        if rel > 1e-3:
            bad.append("%s %.3g" % (n, rel))
    ok(not bad and off == flat.size, "%s: weight gradients == PyTorch's (eval BN), worst relative "
       "L2 error %.3g over %d tensors" % (tag, worst, len(grads)), "; ".join(bad[:4]))
    return st


def check_psworker(a, st, place, div):
    net = O.build(K, T, place, div, 0.0, WIDTH)
    common = ["--model", "tsm-r18", "--width", WIDTH, "--size", H, "--frames", T,
              "--num-classes", K, "--threads", 1, "--loader-threads", 1, "--root", a.data,
              "--val-list", os.path.join(a.data, "val.txt"), "--weights", st]
    pred = os.path.join(a.tmp, "pred.csv")
    rc, out = run([a.psworker, "--eval"] + common + ["--predictions", pred])
    ok(rc == 0 and "temporal shift: place %s, 1/%d" % (place, div) in out,
       "psworker --eval takes place %s and 1/%d from the checkpoint" % (place, div), out[-400:])
    if rc:
        return
    _, rows = V.read_predictions(pred)
    worst, bad = 0.0, 0
    scale = H * 256 // 224
    with torch.no_grad():
        for i, (d, nf, lab) in enumerate(V.read_list(os.path.join(a.data, "val.txt"))):
            x = torch.from_numpy(V.load_clip(os.path.join(a.data, d), nf, T, scale, H))
            t = net(x)[0].double()
            c = torch.from_numpy(rows[i][3])
            good, _ = close(c, t)
            bad += not good
            worst = max(worst, (c - t).abs().max().item())
    ok(bad == 0, "psworker --eval's logits == PyTorch's official TSM on TSM's test pipeline "
       "(%d of %d videos outside; worst |diff| %.3g)" % (bad, len(rows), worst))
    rc, out = run([a.psworker, "--eval"] + common + ["--shift-place", "blockres"])
    ok(rc == 2 and "--shift-place blockres" in out and "'block'" in out,
       "--shift-place blockres on a 'block' checkpoint: usage error naming both", out[-300:])


def check_bad(a, st_a, st_b):
    out = os.path.join(a.tmp, "ctl")
    rc, _ = engine(a, st_b, out, "block", 8)
    lc = torch.from_numpy(np.fromfile(os.path.join(out, "logits.bin"), np.float32)).view(CLIPS, K)
    net = O.build(K, T, "block", 4, 0.0, WIDTH)
    with torch.no_grad():
        lt = net(G.hash_input(CLIPS, T, H, H, G.SEED))
    good, m = close(lc, lt)
    ok(rc == 0 and not good, "control: the 1/4 checkpoint run with 1/8 misses the tolerance (%s)" % m)
    rc, msg = engine(a, st_b, out, "blockres", 4)
    ok(rc != 0 and "placed 'block'" in msg, "control: a 'block' checkpoint into a 'blockres' "
       "model is refused", msg[-300:])
    # an unknown tensor (a non-local block's) and a wrong shape
    sd, meta = G.read_safetensors(st_b)
    sd = {k: v.numpy() for k, v in sd.items()}
    extra = dict(sd)
    extra["base_model.layer1.0.nl.weight"] = np.ones(4, np.float32)
    bad = os.path.join(a.tmp, "extra.safetensors")
    G.write_safetensors(bad, extra, meta)
    rc, msg = engine(a, bad, out, "block", 4)
    ok(rc != 0 and "base_model.layer1.0.nl.weight" in msg, "an unknown tensor is refused by name",
       msg[-300:])
    wrong = dict(sd)
    k = "base_model.layer2.0.net.conv1.weight"  # (16, 8, 3, 3)
    wrong[k] = np.ascontiguousarray(sd[k].transpose(1, 0, 2, 3))
    bad = os.path.join(a.tmp, "wrong.safetensors")
    G.write_safetensors(bad, wrong, meta)
    rc, msg = engine(a, bad, out, "block", 4)
    ok(rc != 0 and k in msg, "a wrong shape is refused by name (%s)" % k, msg[-300:])


def check_finetune(a, st_a):
    """A (5 classes, new_fc) and an ImageNet-layout torchvision resnet18
    starting 4-class runs: the classifier re-initialised and listed."""
    common = ["--standalone", "--model", "tsm-r18", "--size", H, "--frames", T, "--threads", 1,
              "--loader-threads", 1, "--root", a.data, "--train-list",
              os.path.join(a.data, "train.txt"), "--val-list", os.path.join(a.data, "val.txt"),
              "--steps", 1, "--batch", 2, "--dropout", 0]
    rc, out = run([a.psworker] + common + ["--width", WIDTH, "--weights", st_a])
    ok(rc == 0 and "module.new_fc.weight is [5, 64] in the file, [4, 64] here: re-initialised" in out,
       "fine-tuning the TSM checkpoint to 4 classes lists the re-initialised classifier",
       out[-400:])
    torch.manual_seed(5)
    tv = torchvision.models.resnet18()
    pth = os.path.join(a.tmp, "resnet18_imagenet_random.pth")
    torch.save(tv.state_dict(), pth)
    st = pth.replace(".pth", ".safetensors")
    convert(pth, st)
    rc, out = run([a.psworker] + common + ["--width", 64, "--weights", st])
    ok(rc == 0 and "fc.weight is [1000, 512] in the file, [4, 512] here: re-initialised" in out
       and "fc.bias is [1000] in the file" in out,
       "a torchvision resnet18 (1000 classes) starts a 4-class TSM-R18, fc listed", out[-400:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--weights-eval", dest="weights_eval", required=True)
    ap.add_argument("--psworker", required=True)
    ap.add_argument("--data", required=True, help="a psdata gen-video dataset (4 classes)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    st_a = check_case(a, "A", "blockres", 8, 0.5, True)
    st_b = check_case(a, "B", "block", 4, 0.0, False)
    check_psworker(a, st_b, "block", 4)
    check_bad(a, st_a, st_b)
    check_finetune(a, st_a)
    sys.exit(plan())


if __name__ == "__main__":
    main()
