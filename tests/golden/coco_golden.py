"""Helpers of the pycocotools golden scripts (gen_coco_eval.py,
gen_coco_segm.py, gen_coco_masks.py): run with the venv those scripts name."""
import contextlib
import io
import os

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval


def counts_str(rle):
    """An RLE's compressed counts as str (pycocotools gives bytes)."""
    c = rle["counts"]
    return c.decode() if isinstance(c, bytes) else c


def write_stats(here, gt_name, dt_name, iou_type, stats_name, script):
    """COCOeval(iou_type) of here/dt_name against here/gt_name, written to
    here/stats_name: the 12 stats with repr, then the per-category AP (IoU
    .5:.95, area all, maxDets 100) as "cat <id> <ap>".  Returns the stats."""
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(os.path.join(here, gt_name))
        dt = gt.loadRes(os.path.join(here, dt_name))
        ev = COCOeval(gt, dt, iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    with open(os.path.join(here, stats_name), "w") as f:
        f.write("# COCOeval(%s).stats from pycocotools (%s)\n" % (iou_type, script))
        for s in ev.stats:
            f.write(repr(float(s)) + "\n")
        pr = ev.eval["precision"][:, :, :, 0, 2]  # T, R, K at area all, maxDets 100
        for k, c in enumerate(ev.params.catIds):
            p = pr[:, :, k]
            ap = float(np.mean(p[p > -1])) if (p > -1).any() else -1.0
            f.write("cat %d %r\n" % (c, ap))
    return ev.stats
