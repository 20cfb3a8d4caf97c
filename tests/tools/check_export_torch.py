#!/usr/bin/python3
"""psworker's exported model, evaluated in PyTorch (run by
tests/check_export_torch.sh; one of docs/video.md's checks).

Loads model.safetensors with load_state_dict(strict=True) into
torchvision.models.resnetXX(num_classes=K), adds TSM's temporal shift
(1/8 of the channels each way, residual branch, as TSM's
make_temporal_shift(place='blockres'); tests/golden/gen_resnet.py), and runs
TSM's test pipeline on the same val list, independently of the C code
(tests/lib/video_ref.py: _get_val_indices, PIL decode, GroupScale,
GroupCenterCrop, ImageNet normalisation); eval mode, fc on every frame,
mean over the T segments.

Compared with psworker's own evaluation of the same file (psworker --eval
--predictions CSV, and the final line of the training run's rank 0):
  - per-video logits within |c - t| <= 1e-4 + 1e-3*|t| (fp32 on both sides,
    different summation orders, ~20 layers; libjpeg-turbo under both, so
    the decoded pixels are the same);
  - the same predicted class for every video;
  - the same top-1 / top-5 (printed with 4 decimals by psworker).
TAP on stdout; exit 77 when torch / torchvision / PIL are missing.
"""
import argparse
import os
import sys

try:
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))  # the golden generators
sys.path.insert(0, os.path.join(_here, "..", "lib"))     # taplib
import gen_resnet as G  # noqa: E402
import video_ref as V  # noqa: E402
from taplib import ok, plan  # noqa: E402

final_kv = V.final_kv

def load_clip(d, F, T, scale, crop, tmpl):
    return torch.from_numpy(V.load_clip(d, F, T, scale, crop, tmpl))


def load_frames(d, inds, scale, crop, tmpl):
    """Frames inds (1-based) of folder d through TSM's test transform (scale
    the shorter side, centre crop, normalise): (len(inds), 3, crop, crop)."""
    out = []
    for i in inds:
        im = V.scale_shorter(Image.open(os.path.join(d, tmpl % i)).convert("RGB"), scale)
        (x, y), = V.crop_offsets(im.size[0], im.size[1], crop, 1)
        out.append(V.normalise(im.crop((x, y, x + crop, y + crop))))
    return torch.from_numpy(np.stack(out).astype(np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--depth", type=int, default=18)
    ap.add_argument("--shift", type=int, default=1)
    ap.add_argument("--val-list", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--tmpl", default="img_%05d.jpg")
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--scale-size", type=int, default=0)
    ap.add_argument("--predictions", required=True)
    ap.add_argument("--eval-out", required=True, help="stdout of psworker --eval")
    ap.add_argument("--train-out", help="stdout of the training run's rank 0")
    a = ap.parse_args()
    T, crop = a.frames, a.size
    scale = a.scale_size or crop * 256 // 224
    torch.set_num_threads(1)

    sd, meta = G.read_safetensors(a.weights)
    K = sd["fc.weight"].shape[0]
    net = getattr(torchvision.models, "resnet%d" % a.depth)(num_classes=K)
    try:
        res = net.load_state_dict(sd, strict=True)
        ok(not res.missing_keys and not res.unexpected_keys,
           "load_state_dict(strict=True) into torchvision resnet%d(num_classes=%d)" % (a.depth, K))
    except RuntimeError as e:
        ok(False, "load_state_dict(strict=True) into torchvision", str(e).replace("\n", " ")[:400])
        return
    moved = sum(int((sd[k] != 1).any()) for k in sd if k.endswith("running_var"))
    ok(moved > 0, "the file's BN running statistics were trained (%d running_var tensors "
       "differ from the init 1)" % moved)
    # controls, to show the comparison can fail: the same file without the
    # temporal shift, and with the BN statistics reset to the init (0 / 1)
    noshift = getattr(torchvision.models, "resnet%d" % a.depth)(num_classes=K)
    noshift.load_state_dict(sd, strict=True)
    nostats = getattr(torchvision.models, "resnet%d" % a.depth)(num_classes=K)
    nostats.load_state_dict({k: (torch.zeros_like(v) if k.endswith("running_mean") else
                                 torch.ones_like(v) if k.endswith("running_var") else v)
                             for k, v in sd.items()}, strict=True)
    if a.shift:
        G.make_temporal_shift(net, T, 8)
        G.make_temporal_shift(nostats, T, 8)
    for m in (net, noshift, nostats):
        m.eval()

    rows = [l.split(",") for l in open(a.predictions).read().splitlines()]
    head, rows = rows[0], rows[1:]
    ok(head[:4] == ["index", "video", "label", "pred"] and len(head) == 4 + K,
       "predictions CSV header: index,video,label,pred + %d logits" % K)
    lines = [l.split() for l in open(a.val_list) if l.strip()]
    ok(len(rows) == len(lines), "one prediction per val video (%d rows, %d videos)"
       % (len(rows), len(lines)))
    by_index = {int(r[0]): r for r in rows}

    worst, worst_ref, bad_logit, bad_pred = 0.0, 0.0, 0, 0
    ctl = {"without the shift": 0, "with init BN statistics": 0}
    preds = set()
    c1 = c5 = 0
    with torch.no_grad():
        for i, (d, F, y) in enumerate(lines):
            F, y = int(F), int(y)
            x = load_clip(os.path.join(a.root, d), F, T, scale, crop, a.tmpl)
            t = net(x).view(1, T, -1).mean(1)[0].double()
            rank = sum(1 for c in range(K) if t[c] > t[y] or (t[c] == t[y] and c < y))
            c1 += rank < 1
            c5 += rank < 5
            r = by_index.get(i)
            if r is None or r[1] != d or int(r[2]) != y:
                bad_pred += 1
                continue
            c = torch.tensor([float(v) for v in r[4:]], dtype=torch.float64)
            for name, m in (("without the shift", noshift), ("with init BN statistics", nostats)):
                u = m(x).view(1, T, -1).mean(1)[0].double()
                ctl[name] += int(bool(((c - u).abs() > 1e-4 + 1e-3 * u.abs()).any()))
            preds.add(int(t.argmax().item()))
            diff = (c - t).abs()
            if bool((diff > 1e-4 + 1e-3 * t.abs()).any()):
                bad_logit += 1
            if diff.max().item() > worst:
                worst, worst_ref = diff.max().item(), t.abs().max().item()
            bad_pred += int(r[3]) != int(t.argmax().item())
    n = len(lines)
    ok(bad_logit == 0, "per-video logits: psworker == PyTorch within 1e-4 + 1e-3*|t| for all %d "
       "videos (worst |diff| %.3g, logits up to %.3g)" % (n, worst, worst_ref))
    ok(bad_pred == 0, "per-video predicted class: psworker == PyTorch (%d of %d differ; %d "
       "distinct classes predicted)" % (bad_pred, n, len(preds)))
    if a.shift:
        ok(ctl["without the shift"] > n // 2, "control: PyTorch without the temporal shift misses "
           "the tolerance on %d of %d videos" % (ctl["without the shift"], n))
    ok(ctl["with init BN statistics"] > n // 2, "control: PyTorch with the init BN statistics "
       "misses the tolerance on %d of %d videos" % (ctl["with init BN statistics"], n))
    top1, top5 = c1 / float(n), c5 / float(n)
    ev = final_kv(a.eval_out)
    ok(ev.get("top1") == "%.4f" % top1 and ev.get("top5") == "%.4f" % top5,
       "psworker --eval top1=%s top5=%s, PyTorch top1=%.4f top5=%.4f"
       % (ev.get("top1"), ev.get("top5"), top1, top5))
    if a.train_out:
        tr = final_kv(a.train_out)
        ok(tr.get("top1") == "%.4f" % top1 and tr.get("top5") == "%.4f" % top5,
           "training run's final line (rank 0) top1=%s top5=%s == PyTorch"
           % (tr.get("top1"), tr.get("top5")))
    sys.exit(plan())


if __name__ == "__main__":
    main()
