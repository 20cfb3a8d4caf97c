#!/usr/bin/python3
"""psworker's ONNX files in onnxruntime (run by tests/check_onnx.sh in a
venv with the PyPI packages onnx and onnxruntime; exit 77 without them).

  tool DIR...     directories written by tests/tools/onnx_export: the
                  checker accepts model.onnx (full_check: shapes inferred
                  through every node); onnxruntime's outputs for input.bin
                  equal the C engine's (out0.bin, out1.bin) within
                  1e-4 + 1e-3*|c| (fp32 on both sides, other summation
                  orders); the declared opset and IR version; the temporal
                  shift is Slice / Pad / Concat (no op outside the default
                  domain)
  video ...       a psworker --export-onnx file on a validation list: the
                  views of every video through TSM's test pipeline
                  (tests/lib/video_ref.py: PIL, no C), run by onnxruntime,
                  averaged over the views, against psworker --eval
                  --predictions' logits within 1e-4 + 1e-3*|c|, the same
                  predicted classes and top-1 / top-5; --same B.onnx: a
                  second file (psctl export --onnx) gives identical outputs
"""
import argparse
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print("1..0 # SKIP %s" % e)
    sys.exit(77)

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "lib"))
import video_ref as V  # noqa: E402
from taplib import ok, plan  # noqa: E402

ATOL, RTOL = 1e-4, 1e-3
OPSET, IR = 17, 8


def close(got, ref):
    d = np.abs(got.astype(np.float64) - ref)
    bad = d > ATOL + RTOL * np.abs(ref)
    return not bad.any(), "worst |diff| %.3g (outputs up to %.3g), %d of %d outside" % (
        d.max(), np.abs(ref).max(), int(bad.sum()), d.size)


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check_file(path, tag):
    m = onnx.load(path)
    try:
        onnx.checker.check_model(m, full_check=True)
        ok(True, "%s: onnx.checker.check_model(full_check=True) accepts it" % tag)
    except Exception as e:  # the checker's own exception types vary by version
        ok(False, "%s: onnx.checker accepts it" % tag, str(e)[:300])
    ops = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    ok(m.ir_version == IR and len(ops) == 1 and ops[0].version == OPSET,
       "%s: IR version %d, opset %d (got IR %d, %s)" % (
           tag, IR, OPSET, m.ir_version, [(o.domain, o.version) for o in m.opset_import]))
    kinds = sorted(set(n.op_type for n in m.graph.node))
    ok(all(not n.domain for n in m.graph.node), "%s: standard operators only: %s" % (
        tag, " ".join(kinds)))
    return m


def check_tool(d):
    cfg = open(os.path.join(d, "config.txt")).read().split()
    tag = os.path.basename(d.rstrip("/"))
    m = check_file(os.path.join(d, "model.onnx"), tag)
    s = session(os.path.join(d, "model.onnx"))
    x = np.fromfile(os.path.join(d, "input.bin"), np.float32)
    if cfg[0] == "video":
        clips, T, H, K = map(int, cfg[1:])
        feeds = {"clips": x.reshape(clips, T, 3, H, H)}
        refs = [np.fromfile(os.path.join(d, "out0.bin"), np.float32).reshape(clips, K)]
        shifted = any(n.op_type == "Pad" for n in m.graph.node)
        ok(shifted == (tag != "tsn"), "%s: the temporal shift is %s Pad / Slice / Concat" %
           (tag, "in" if shifted else "absent from"))
    else:
        n, H, K, A = map(int, cfg[1:])
        feeds = {"images": x.reshape(n, 3, H, H)}
        refs = [np.fromfile(os.path.join(d, "out0.bin"), np.float32).reshape(n, A, K),
                np.fromfile(os.path.join(d, "out1.bin"), np.float32).reshape(n, A, 4)]
    outs = s.run(None, feeds)
    for i, (o, r) in enumerate(zip(outs, refs)):
        good, msg = close(o, r.astype(np.float64))
        ok(o.shape == r.shape and good, "%s: onnxruntime output %d %s == the C engine's: %s" %
           (tag, i, list(o.shape), msg))
    if cfg[0] == "video" and clips > 1:
        # the batch is symbolic: one clip alone gives that clip's row
        one = s.run(None, {"clips": feeds["clips"][1:2]})[0]
        good, msg = close(one[0], refs[0][1].astype(np.float64))
        ok(good, "%s: batch 1 (symbolic batch) gives the same row: %s" % (tag, msg))


def check_video(a):
    s = session(a.onnx)
    check_file(a.onnx, os.path.basename(a.onnx))
    other = session(a.same) if a.same else None
    lines = V.read_list(a.val_list)
    head, pred = V.read_predictions(a.predictions)
    K = len(head) - 4
    scale = a.scale_size or (a.size if a.crops == 3 else a.size * 256 // 224)
    bad_logit = bad_pred = differ = 0
    worst = 0.0
    c1 = c5 = 0
    for i, (d, F, y) in enumerate(lines):
        views = V.load_views(os.path.join(a.root, d), F, a.frames, scale, a.size,
                             n_clips=a.clips, n_crops=a.crops)
        out = s.run(None, {"clips": views})[0]
        t = out.astype(np.float64).mean(0)  # TSM: the mean of the views' logits
        if other is not None:
            differ += int(not np.array_equal(other.run(None, {"clips": views})[0], out))
        r = V.rank_of(t, y)
        c1 += r < 1
        c5 += r < 5
        row = pred.get(i)
        if row is None or row[0] != d or row[1] != y:
            bad_pred += 1
            continue
        dd = np.abs(row[3] - t)
        worst = max(worst, float(dd.max()))
        bad_logit += int((dd > ATOL + RTOL * np.abs(t)).any())
        bad_pred += int(row[2] != int(np.argmax(t)))
    n = len(lines)
    ok(bad_logit == 0, "%d videos x %d clips x %d crops: onnxruntime's logits == psworker --eval's "
       "within %g + %g*|t| (worst |diff| %.3g)" % (n, a.clips, a.crops, ATOL, RTOL, worst))
    ok(bad_pred == 0, "the same predicted class for every video (%d differ)" % bad_pred)
    ev = V.final_kv(a.eval_out)
    ok(ev.get("top1") == "%.4f" % (c1 / n) and ev.get("top5") == "%.4f" % (c5 / n),
       "top-1 / top-5: psworker %s / %s, onnxruntime %.4f / %.4f" % (
           ev.get("top1"), ev.get("top5"), c1 / n, c5 / n))
    if other is not None:
        ok(differ == 0, "%s gives bit-identical outputs (%d videos differ)" % (a.same, differ))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "tool":
        for d in sys.argv[2:]:
            check_tool(d)
        sys.exit(plan())
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["video"])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--same")
    ap.add_argument("--val-list", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--frames", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--scale-size", type=int, default=0)
    ap.add_argument("--clips", type=int, default=1)
    ap.add_argument("--crops", type=int, default=1)
    ap.add_argument("--predictions", required=True)
    ap.add_argument("--eval-out", required=True)
    check_video(ap.parse_args())
    sys.exit(plan())


if __name__ == "__main__":
    main()
