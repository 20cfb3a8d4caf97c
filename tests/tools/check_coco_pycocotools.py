"""pycocotools' view of what the C code wrote (tests/check_coco_pycocotools.sh).

Jobs, any number, in order:
  --dataset GT.json
      pycocotools loads it; every annotation's mask (annToRLE) has the
      annotation's area as its pixel count and its bbox as its toBbox;
  --results GT.json RES.json STATS
      loadRes reads the results file (boxes and compressed-RLE masks); its
      COCOeval stats equal the C evaluator's in STATS ("bbox <12>" and
      "segm <12>" lines): bbox as the file is, segm with the boxes dropped
      (mask areas for small / medium / large, as Detectron2 evaluates);
  --ap GT.json RES.json MAP AP50 AP75
      COCOeval(bbox) of a psworker --predictions file gives the AP, AP50 and
      AP75 psworker printed (4 decimals);
  --segm-ap GT.json RES.json MAP AP50 AP75
      the same for a Mask R-CNN's masks: COCOeval(segm) of the file with
      the boxes dropped (mask areas, as the C evaluator and Detectron2)
      gives the segm_map, segm_ap50, segm_ap75 psworker printed; map and
      ap50 must be above zero (a model that segments nothing would make the
      comparison 0 against 0 and prove nothing).
Prints TAP (tests/lib/taplib.py); exit 1 when a check failed.
"""
import contextlib
import io
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import taplib  # noqa: E402

import numpy as np  # noqa: E402
import pycocotools.mask as mu  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402


def quiet(f, *a):
    with contextlib.redirect_stdout(io.StringIO()):
        return f(*a)


def stats(gt, res, kind):
    dt = quiet(gt.loadRes, res)
    ev = COCOeval(gt, dt, kind)
    quiet(ev.evaluate)
    quiet(ev.accumulate)
    quiet(ev.summarize)
    return np.array(ev.stats)


def dataset(gtf):
    gt = quiet(COCO, gtf)
    anns = gt.dataset["annotations"]
    bad = []
    for a in anns:
        r = gt.annToRLE(a)
        if int(mu.area(r)) != a["area"] or [float(v) for v in mu.toBbox(r)] != a["bbox"]:
            bad.append(a["id"])
    kinds = {"polygons": sum(isinstance(a["segmentation"], list) for a in anns)}
    kinds["RLE"] = len(anns) - kinds["polygons"]
    taplib.ok(anns and not bad, "%s: %d masks (%d polygons, %d RLE) give back area and box"
              % (os.path.basename(gtf), len(anns), kinds["polygons"], kinds["RLE"]),
              "annotations differing: %s" % bad[:10])


def results(gtf, resf, statsf):
    gt = quiet(COCO, gtf)
    want = {}
    for line in open(statsf):
        k, *v = line.split()
        want[k] = np.array([float(x) for x in v])
    with open(resf) as f:
        res = json.load(f)
    taplib.ok(res and all("segmentation" in r and "bbox" in r for r in res),
              "%s: %d results with bbox and segmentation" % (os.path.basename(resf), len(res)))
    b = stats(gt, resf, "bbox")
    taplib.ok(np.allclose(b, want["bbox"], rtol=0, atol=1e-9),
              "bbox stats of the C-written file equal the C evaluator's (AP %.4f)" % b[0],
              "pycocotools %s vs C %s" % (b.tolist(), want["bbox"].tolist()))
    for r in res:
        r.pop("bbox")
    s = stats(gt, res, "segm")
    taplib.ok(np.allclose(s, want["segm"], rtol=0, atol=1e-9),
              "segm stats of the C-written masks equal the C evaluator's (AP %.4f)" % s[0],
              "pycocotools %s vs C %s" % (s.tolist(), want["segm"].tolist()))


def ap(gtf, resf, m, a50, a75, kind="bbox"):
    gt = quiet(COCO, gtf)
    with open(resf) as f:
        res = json.load(f)
    n = len(res)
    if kind == "segm":
        for r in res:
            r.pop("bbox")
    s = stats(gt, res, kind)
    printed = np.array([float(m), float(a50), float(a75)])
    diff = np.abs(s[:3] - printed).max()
    # psworker prints 4 decimals: equal to within the rounding
    taplib.ok(n > 0 and diff <= 0.00005 + 1e-12,
              "psworker's %d predictions scored by pycocotools (%s): map=%.4f ap50=%.4f "
              "ap75=%.4f, printed %s %s %s (largest difference %.2g)"
              % (n, kind, s[0], s[1], s[2], m, a50, a75, diff))


def segm_ap(gtf, resf, m, a50, a75):
    ap(gtf, resf, m, a50, a75, "segm")
    taplib.ok(min(float(m), float(a50)) > 0,
              "the masks scored are worth comparing: segm map=%s ap50=%s above 0" % (m, a50))


def main(argv):
    i = 0
    jobs = {"--dataset": (1, dataset), "--results": (3, results), "--ap": (5, ap),
            "--segm-ap": (5, segm_ap)}
    while i < len(argv):
        n, f = jobs[argv[i]]
        f(*argv[i + 1:i + 1 + n])
        i += 1 + n
    return taplib.plan()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
