#!/usr/bin/python3
"""TSM's test protocol in psworker --eval (run by tests/check_test_protocol.sh;
TAP; exit 77 without torch / PIL).

Makes its own videos with frames that are not square -- landscape 56x40 and
portrait 40x56, 11 frames of smooth random colour fields, so every crop
position shows in the logits -- and a TSM-ResNet-18 (width 8, 4 segments,
random BN statistics) in torchvision names; psworker evaluates it with
--predictions, and PyTorch evaluates the same weights on views cut by
tests/lib/video_ref.py (numpy / PIL: segment points, GroupScale, centre crop
or GroupFullResSample's three crops along the longer side), averaging the
raw logits over the views as TSM's test_models.py does.  For each protocol:
  - per-video logits within 1e-4 + 1e-3*|t|, the same top-1 / top-5;
  - the final line names the clips and crops.
Protocols: 1 clip centre crop (scale 36 = size*256/224); 2 clips x 3 crops
at full resolution (shorter side = crop size 32); 3 clips x 3 crops with
--scale-size 40 (TSM's 3 crops without --full_res).
Controls that show the comparison can fail: the views averaged after a
softmax, and TSM's own stepping along the width for portrait frames (three
identical centre crops), each miss the tolerance on the videos they change.
"""
import argparse
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
    from PIL import Image
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))
sys.path.insert(0, os.path.join(_here, "..", "lib"))
import gen_resnet as G  # noqa: E402
import video_ref as V  # noqa: E402
from taplib import ok, plan  # noqa: E402

T, SIZE, K, FRAMES = 4, 32, 4, 11


def make_videos(root):
    """8 videos, half landscape, half portrait; smooth fields upsampled from
    a coarse random grid (JPEG keeps them close to what was drawn)."""
    rng = np.random.RandomState(7)
    lines = []
    for v in range(8):
        w, h = (56, 40) if v % 2 == 0 else (40, 56)
        d = "vid%02d" % v
        os.makedirs(os.path.join(root, d), exist_ok=True)
        for f in range(1, FRAMES + 1):
            coarse = (rng.rand(h // 8 + 1, w // 8 + 1, 3) * 255).astype(np.uint8)
            im = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
            im.save(os.path.join(root, d, "img_%05d.jpg" % f), quality=95)
        lines.append("%s %d %d\n" % (d, FRAMES, v % K))
    with open(os.path.join(root, "val.txt"), "w") as f:
        f.writelines(lines)


def portrait_as_tsm(w, h, crop, n_crops):
    """TSM's GroupFullResSample as written: steps along the width only."""
    if n_crops == 1:
        return V.crop_offsets(w, h, crop, 1)
    ws, hs = (w - crop) // 4, (h - crop) // 4
    return [(0, 2 * hs), (4 * ws, 2 * hs), (2 * ws, 2 * hs)]


def reference(net, root, lines, clips, crops, scale, softmax=False, offsets=None):
    out = []
    saved = V.crop_offsets
    if offsets:
        V.crop_offsets = offsets
    try:
        with torch.no_grad():
            for d, nf, _ in lines:
                views = V.load_views(os.path.join(root, d), nf, T, scale, SIZE, n_clips=clips,
                                     n_crops=crops)
                lg = net(torch.from_numpy(views.reshape(-1, 3, SIZE, SIZE))).view(-1, T, K).mean(1)
                lg = torch.softmax(lg.double(), 1) if softmax else lg.double()
                out.append(lg.mean(0))
    finally:
        V.crop_offsets = saved
    return out


def misses(c, t):
    return bool(((c - t).abs() > 1e-4 + 1e-3 * t.abs()).any())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--psworker", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    root = os.path.join(a.tmp, "ds")
    make_videos(root)
    lines = V.read_list(os.path.join(root, "val.txt"))
    net = G.build(18, K, width=8, shift=True, n_segment=T, replica=True)
    G.hash_init(net, 99, True)
    net.eval()
    weights = os.path.join(a.tmp, "tsm.safetensors")
    G.write_safetensors(weights, G.state_dict_numpy(net), {"format": "pt"})
    common = [a.psworker, "--eval", "--model", "tsm-r18", "--width", "8", "--size", str(SIZE),
              "--frames", str(T), "--num-classes", str(K), "--threads", "1", "--loader-threads",
              "1", "--root", root, "--val-list", os.path.join(root, "val.txt"), "--weights",
              weights, "--log-level", "warn"]
    protocols = [("1 clip, centre crop", 1, 1, 0, SIZE * 256 // 224),
                 ("2 clips x 3 crops, full resolution", 2, 3, 0, SIZE),
                 ("3 clips x 3 crops, --scale-size 40", 3, 3, 40, 40)]
    for name, clips, crops, ss, scale in protocols:
        pred = os.path.join(a.tmp, "pred%d%d.csv" % (clips, crops))
        args = common + ["--test-clips", str(clips), "--test-crops", str(crops),
                         "--predictions", pred] + (["--scale-size", str(ss)] if ss else [])
        r = subprocess.run(args, capture_output=True, text=True)
        kv = V.final_kv(os.devnull)
        if r.returncode == 0:
            kv = dict(x.split("=", 1) for x in r.stdout.split("final:")[-1].split() if "=" in x)
        ok(r.returncode == 0 and kv.get("clips") == str(clips) and kv.get("crops") == str(crops),
           "%s: psworker --eval runs (final line: clips=%s crops=%s)" % (
               name, kv.get("clips"), kv.get("crops")), r.stderr[-300:])
        if r.returncode:
            continue
        _, rows = V.read_predictions(pred)
        ref = reference(net, root, lines, clips, crops, scale)
        bad, worst, c1, c5 = 0, 0.0, 0, 0
        for i, (t, (_, _, y)) in enumerate(zip(ref, lines)):
            c = torch.from_numpy(rows[i][3])
            bad += misses(c, t)
            worst = max(worst, (c - t).abs().max().item())
            rk = V.rank_of(t.tolist(), y)
            c1 += rk < 1
            c5 += rk < 5
        n = len(lines)
        ok(bad == 0, "%s: per-video logits == the numpy / PyTorch reference (mean of the views' "
           "raw logits) within 1e-4 + 1e-3*|t|: %d of %d outside, worst |diff| %.3g" % (
               name, bad, n, worst))
        ok(kv.get("top1") == "%.4f" % (c1 / n) and kv.get("top5") == "%.4f" % (c5 / n),
           "%s: top-1 / top-5 %s / %s == the reference's %.4f / %.4f" % (
               name, kv.get("top1"), kv.get("top5"), c1 / n, c5 / n))
        if crops == 3 and ss == 0:
            soft = reference(net, root, lines, clips, crops, scale, softmax=True)
            ok(sum(misses(torch.from_numpy(rows[i][3]), soft[i]) for i in range(n)) == n,
               "%s: control: the mean of softmaxes misses on every video" % name)
            tsm = reference(net, root, lines, clips, crops, scale, offsets=portrait_as_tsm)
            nport = sum(1 for i in range(n) if misses(torch.from_numpy(rows[i][3]), tsm[i]))
            ok(nport == n // 2, "%s: control: TSM's width-only steps miss on the %d portrait "
               "videos and only there (%d)" % (name, n // 2, nport))
    sys.exit(plan())


if __name__ == "__main__":
    main()
