#!/usr/bin/python3
"""The 3-D video models in PyTorch (run by tests/check_video3d_torch.sh).

Sub-commands (several in one run, separated by "--"):

  export DIR...   each DIR from tests/tools/video3d_export at width 64:
                  model.safetensors strict-loads into torchvision.models.video
                  (r3d_18 / mc3_18 / r2plus1d_18) or into the I3D-ResNet-50
                  of tests/golden/gen_video3d.py (torchvision ResNet-50
                  names); the hash clip gives the C engine's logits in eval
                  and in training mode; after the training forward the BN
                  statistics equal model_after.safetensors'.
  inflate DIR MODE FILE
                  FILE is a torchvision resnet50 converted by
                  worker/models/torch2safetensors.py; DIR's logits come
                  from it inflated into I3D by the C engine (MODE mean or
                  centre): PyTorch inflates the same state dict itself
                  (mean: the kernel / T on each slice; centre: the kernel on
                  slice T//2) and must give the same logits; and the C
                  engine's exported weights must equal PyTorch's inflation.
  eval ...        psworker --eval of an exported model on a val list ==
                  PyTorch's evaluation of the same file: the same dense test
                  clips (mmaction2's SampleFrames rule,
                  tests/golden/gen_video_dense.py), PIL decode, shorter side
                  to scale_size, centre crop, ImageNet normalisation; the
                  per-video logits (mean over the clips), predictions and
                  top-1 / top-5.

Tolerances: |c - t| <= 1e-4 + 1e-3*|t| on logits (fp32 on both sides,
different summation orders).  TAP on stdout; exit 77 without torch.
"""
import argparse
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "golden"))
sys.path.insert(0, os.path.join(_here, "..", "lib"))
import gen_resnet as G  # noqa: E402
import gen_video3d as V  # noqa: E402
import gen_video_dense as D  # noqa: E402
import check_export_torch as CE  # noqa: E402
from taplib import ok, plan  # noqa: E402


def close(got, want, atol=1e-4, rtol=1e-3):
    d = (got - want).abs()
    return (not bool((d > atol + rtol * want.abs()).any())), \
        "worst |diff| %.3g (ref %.3g)" % (d.max().item(), want.abs().max().item())


def torch_model(arch, K):
    """torchvision's module for the video ResNets, ours for I3D."""
    if arch in V.TV_BUILDERS:
        net = V.torchvision_video(arch, K)
        if net is None:
            print("# torchvision not importable: using the replica of its module tree")
            net = V.build(arch, K)
        return net
    return V.build(arch, K)


def strict_load(net, sd, what):
    try:
        res = net.load_state_dict(sd, strict=True)
        return ok(not res.missing_keys and not res.unexpected_keys,
                  "%s: load_state_dict(strict=True)" % what)
    except RuntimeError as e:
        ok(False, "%s: load_state_dict(strict=True)" % what, str(e).replace("\n", " ")[:400])
        return False


def check_export(d):
    arch, K, clips, T, H, seed = open(os.path.join(d, "config.txt")).read().split()
    K, clips, T, H, seed = int(K), int(clips), int(T), int(H), int(seed)
    net = torch_model(arch, K)
    sd, meta = G.read_safetensors(os.path.join(d, "model.safetensors"))
    ok(meta.get("ps.arch") == arch, "%s: metadata ps.arch=%s" % (arch, meta.get("ps.arch")))
    if not strict_load(net, sd, "%s into %s" % (arch, type(net).__module__ + "." +
                                                type(net).__name__)):
        return
    x = V.hash_clip(clips, T, H, H, seed)
    for mode, fname, what in (("eval", "logits_eval.bin", "eval logits"),
                              ("train", "logits_train.bin", "training-mode (batch BN) logits")):
        net.train(mode == "train")
        with torch.no_grad():
            lt = net(x)
        lc = torch.from_numpy(np.fromfile(os.path.join(d, fname), dtype=np.float32))
        good, msg = close(lc.view_as(lt), lt)
        ok(good, "%s: %s equal PyTorch's" % (arch, what), msg)
    after, _ = G.read_safetensors(os.path.join(d, "model_after.safetensors"))
    cur = net.state_dict()
    bad = [k for k in cur if "running" in k and not close(after[k], cur[k])[0]]
    cnt = [k for k in cur if k.endswith("num_batches_tracked") and int(after[k]) != int(cur[k])]
    ok(not bad and not cnt, "%s: BN statistics after the step equal PyTorch's (%d differ)"
       % (arch, len(bad) + len(cnt)), " ".join((bad + cnt)[:3]))


def inflate(sd2, net, mode):
    """PyTorch's own inflation of a 2-D state dict into net's 5-D kernels."""
    out = {}
    for k, v in net.state_dict().items():
        w = sd2[k]
        if v.dim() == 5 and w.dim() == 4:
            T = v.shape[2]
            if mode == "mean":
                w = w.unsqueeze(2).repeat(1, 1, T, 1, 1) / T
            else:
                z = torch.zeros_like(v)
                z[:, :, T // 2] = w
                w = z
        out[k] = w.to(v.dtype)
    return out


def check_inflate(d, mode, file2d):
    arch, K, clips, T, H, seed = open(os.path.join(d, "config.txt")).read().split()
    K, clips, T, H, seed = int(K), int(clips), int(T), int(H), int(seed)
    sd2, _ = G.read_safetensors(file2d)
    net = V.build(arch, K)
    if not strict_load(net, inflate(sd2, net, mode), "%s: torchvision resnet50 inflated (%s) "
                       "in PyTorch" % (arch, mode)):
        return
    c_sd, _ = G.read_safetensors(os.path.join(d, "model.safetensors"))
    bad = [k for k, v in net.state_dict().items()
           if not torch.allclose(c_sd[k].to(v.dtype), v, atol=1e-7, rtol=1e-6)]
    ok(not bad, "%s: the C engine's %s inflation == PyTorch's, every tensor (%d differ)"
       % (arch, mode, len(bad)), " ".join(bad[:3]))
    net.eval()
    x = V.hash_clip(clips, T, H, H, seed)
    with torch.no_grad():
        lt = net(x)
    lc = torch.from_numpy(np.fromfile(os.path.join(d, "logits_eval.bin"), dtype=np.float32))
    good, msg = close(lc.view_as(lt), lt)
    ok(good, "%s: eval logits of the inflated ImageNet-layout weights equal PyTorch's" % arch,
       msg)


def load_frames(d, inds, scale, crop, tmpl):
    """TSM's test transform (check_export_torch.py) of frames inds, as
    PyTorch's video models take a clip: (1, 3, T, H, W)."""
    return CE.load_frames(d, inds, scale, crop, tmpl).permute(1, 0, 2, 3).unsqueeze(0)


def check_eval(a):
    sd, meta = G.read_safetensors(a.weights)
    arch = meta.get("ps.arch", "")
    K = sd["fc.weight"].shape[0]
    net = torch_model(arch, K)
    if not strict_load(net, sd, "%s (psworker's export) into PyTorch" % arch):
        return
    net.eval()
    T, crop, n = a.frames, a.size, a.clips
    scale = a.scale_size or crop * 256 // 224
    rows = [l.split(",") for l in open(a.predictions).read().splitlines()][1:]
    by_index = {int(r[0]): r for r in rows}
    lines = [l.split() for l in open(a.val_list) if l.strip()]
    bad_logit = bad_pred = c1 = c5 = 0
    worst = 0.0
    with torch.no_grad():
        for i, (d, F, y) in enumerate(lines):
            F, y = int(F), int(y)
            clips = D.test_clips(F, T, a.stride, n)
            t = sum(net(load_frames(os.path.join(a.root, d), c, scale, crop, a.tmpl))[0]
                    for c in clips).double() / n
            rank = sum(1 for c in range(K) if t[c] > t[y] or (t[c] == t[y] and c < y))
            c1 += rank < 1
            c5 += rank < 5
            r = by_index.get(i)
            if r is None or r[1] != d or int(r[2]) != y:
                bad_pred += 1
                continue
            c = torch.tensor([float(v) for v in r[4:]], dtype=torch.float64)
            diff = (c - t).abs()
            bad_logit += int(bool((diff > 1e-4 + 1e-3 * t.abs()).any()))
            worst = max(worst, diff.max().item())
            bad_pred += int(r[3]) != int(t.argmax().item())
    m = len(lines)
    ok(bad_logit == 0, "%s: per-video logits (mean of %d dense clips): psworker --eval == "
       "PyTorch for all %d videos (worst |diff| %.3g)" % (arch, n, m, worst))
    ok(bad_pred == 0, "%s: per-video predictions equal (%d of %d differ)" % (arch, bad_pred, m))
    ev = CE.final_kv(a.eval_out)
    ok(ev.get("top1") == "%.4f" % (c1 / float(m)) and ev.get("top5") == "%.4f" % (c5 / float(m)),
       "%s: --eval top1=%s top5=%s, PyTorch %.4f / %.4f" % (arch, ev.get("top1"), ev.get("top5"),
                                                           c1 / float(m), c5 / float(m)))


def run(cmd):
    mode, args = cmd[0], cmd[1:]
    if mode == "export":
        for d in args:
            check_export(d)
    elif mode == "inflate":
        check_inflate(args[0], args[1], args[2])
    elif mode == "eval":
        ap = argparse.ArgumentParser()
        for k in ("--weights", "--val-list", "--root", "--predictions", "--eval-out"):
            ap.add_argument(k, required=True)
        ap.add_argument("--tmpl", default="img_%05d.jpg")
        for k in ("--frames", "--size", "--stride", "--clips"):
            ap.add_argument(k, type=int, required=True)
        ap.add_argument("--scale-size", type=int, default=0)
        check_eval(ap.parse_args(args))
    else:
        print("usage: check_video3d_torch.py CMD [-- CMD ...], CMD = export DIR... | "
              "inflate DIR MODE FILE | eval ARGS", file=sys.stderr)
        sys.exit(2)


def main():
    """Sub-commands separated by "--", one TAP stream for all of them."""
    torch.set_num_threads(1)
    cmds, cur = [], []
    for a in sys.argv[1:]:
        if a == "--":
            cmds.append(cur)
            cur = []
        else:
            cur.append(a)
    cmds.append(cur)
    for c in cmds:
        run(c if c else [""])
    sys.exit(plan())


if __name__ == "__main__":
    main()
