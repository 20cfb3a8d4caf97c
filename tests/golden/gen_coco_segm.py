#!/usr/bin/python3
"""Golden COCO mask evaluation (iouType 'segm') for tests/test_coco_eval.c,
made with pycocotools (from PyPI, in a venv that sees Debian's numpy):
    /usr/bin/python3 -m venv --system-site-packages /tmp/venv-coco
    /tmp/venv-coco/bin/pip install pycocotools        # 2.0.11
    /tmp/venv-coco/bin/python tests/golden/gen_coco_segm.py
Writes tests/golden/coco_segm_gt.json (16 images of varied sizes; polygon
annotations of one to three parts, some poking out of the image;
compressed-RLE annotations with holes; crowd regions as uncompressed RLE;
'area' sometimes differing from the mask's pixel count; a category without
ground truth; images without annotations; a crowd-only image),
tests/golden/coco_segm_dt.json (results with a compressed-RLE
'segmentation' and no 'bbox': shifted, grown and shrunk copies of the GT
masks, duplicates, false positives, masks inside crowd regions, tied
scores, one image with more than 100 detections) and
tests/golden/coco_segm_stats.txt: COCOeval(segm).stats with repr, then the
per-category AP as "cat <id> <ap>".
"""
import json
import math
import os
import random

import numpy as np
import pycocotools.mask as mu
from coco_golden import counts_str, write_stats

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261204)


def uncompressed(mask):
    """Run lengths of a mask in COCO's column-major order, 0s first."""
    flat = mask.flatten(order="F")
    runs, cur, n = [], 0, 0
    for v in flat:
        if v != cur:
            runs.append(n)
            cur, n = v, 0
        n += 1
    runs.append(n)
    return runs


def star(cx, cy, r0, k):
    angs = sorted(rng.uniform(0, 2 * math.pi) for _ in range(k))
    pts = []
    for a in angs:
        r = r0 * rng.uniform(0.45, 1.0)
        pts += [round(cx + r * math.cos(a), 2), round(cy + r * math.sin(a), 2)]
    return pts


def clip_pts(pts, w, h):
    # COCO polygons stay within the image (the reader allows 1 px of slack)
    return [min(max(v, -0.5), (w if i % 2 == 0 else h) + 0.5) for i, v in enumerate(pts)]


cats = [{"id": c, "name": n} for c, n in ((1, "circle"), (2, "square"), (4, "ring"),
                                          (9, "never_annotated"))]
images, anns = [], []
masks = {}  # ann id -> mask (h, w) uint8
aid = 1
for i in range(16):
    w, h = rng.choice([(64, 48), (100, 80), (37, 53), (120, 120), (160, 90), (230, 190)])
    img_id = 300 + 11 * i if i % 3 else 900 - i  # ids out of file order
    images.append({"id": img_id, "width": w, "height": h, "file_name": "%06d.jpg" % img_id})
    if i in (3, 10):
        continue  # no annotations
    crowd_only = i == 7
    for _ in range(1 if crowd_only else rng.randint(1, 7)):
        cat = rng.choice([1, 2, 4])
        kind = rng.random()
        if crowd_only or kind < 0.12:  # crowd region: uncompressed RLE
            m = np.zeros((h, w), np.uint8)
            x0, y0 = rng.randint(0, w // 2), rng.randint(0, h // 2)
            m[y0:y0 + rng.randint(5, h // 2 + 5), x0:x0 + rng.randint(5, w // 2 + 5)] = 1
            m[y0 + 1:y0 + 3, x0 + 1:x0 + 4] = 0
            segm = {"size": [h, w], "counts": uncompressed(m)}
            crowd = 1
        elif kind < 0.3:  # a ring: compressed RLE (a hole polygons cannot express)
            yy, xx = np.mgrid[0:h, 0:w]
            cx, cy = rng.uniform(0, w), rng.uniform(0, h)
            ro = rng.uniform(4, min(w, h) / 2.5)
            d2 = (xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2
            m = ((d2 <= ro * ro) & (d2 >= (0.55 * ro) ** 2)).astype(np.uint8)
            segm = {"size": [h, w], "counts": counts_str(mu.encode(np.asfortranarray(m)))}
            crowd = 0
        else:  # one to three polygons
            parts = []
            cx, cy = rng.uniform(0, w), rng.uniform(0, h)
            for p in range(rng.choice([1, 1, 1, 2, 3])):
                r0 = rng.uniform(min(w, h) / 4 if w >= 200 else 2, min(w, h) / 2.2)
                parts.append(clip_pts(star(cx + p * r0, cy + rng.uniform(-r0, r0), r0,
                                           rng.randint(3, 12)), w, h))
            segm = parts
            m = mu.decode(mu.merge(mu.frPyObjects(parts, h, w)))
            crowd = 0
        r = mu.encode(np.asfortranarray(m))
        if mu.area(r) == 0:
            continue
        area = float(mu.area(r))
        if rng.random() < 0.15:
            area = round(area * rng.uniform(0.6, 1.4), 2)  # COCO's area is not always the count
        anns.append({"id": aid, "image_id": img_id, "category_id": cat,
                     "bbox": [float(v) for v in mu.toBbox(r)], "area": area, "iscrowd": crowd,
                     "segmentation": segm})
        masks[aid] = m
        aid += 1


def shifted(m, dx, dy):
    out = np.zeros_like(m)
    h, w = m.shape
    ys, xs = slice(max(dy, 0), h + min(dy, 0)), slice(max(dx, 0), w + min(dx, 0))
    yd, xd = slice(max(-dy, 0), h + min(-dy, 0)), slice(max(-dx, 0), w + min(-dx, 0))
    out[ys, xs] = m[yd, xd]
    return out


def grow(m, n):
    out = m.copy()
    for _ in range(abs(n)):
        nb = shifted(out, 1, 0) | shifted(out, -1, 0) | shifted(out, 0, 1) | shifted(out, 0, -1)
        out = nb | out if n > 0 else out & shifted(out, 1, 0) & shifted(out, -1, 0) & \
            shifted(out, 0, 1) & shifted(out, 0, -1)
    return out


def det(img_id, cat, m, score):
    r = mu.encode(np.asfortranarray(m.astype(np.uint8)))
    return {"image_id": img_id, "category_id": cat,
            "segmentation": {"size": list(m.shape), "counts": counts_str(r)}, "score": score}


dets = []
by_img = {im["id"]: im for im in images}
for a in anns:
    m, im = masks[a["id"]], by_img[a["image_id"]]
    for k in range(rng.choice([0, 1, 1, 1, 2, 3])):
        j = 1 + 2 * k
        d = shifted(m, rng.randint(-j, j), rng.randint(-j, j))
        d = grow(d, rng.randint(-1, 2))
        if d.sum() == 0:
            continue
        cat = a["category_id"] if rng.random() < 0.9 else rng.choice([1, 2, 4, 9])
        dets.append(det(a["image_id"], cat, d, round(rng.uniform(0.05, 1.0), 3)))
for im in images:  # false positives: blobs anywhere
    h, w = im["height"], im["width"]
    for _ in range(rng.randint(0, 5)):
        yy, xx = np.mgrid[0:h, 0:w]
        cx, cy, rr = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(2, min(w, h) / 3)
        m = ((xx - cx) ** 2 + (yy - cy) ** 2 <= rr * rr).astype(np.uint8)
        if m.sum():
            dets.append(det(im["id"], rng.choice([1, 2, 4, 9]), m, round(rng.uniform(0.05, 0.6), 3)))
# inside crowd regions: ignored, not false positives
for a in anns:
    if a["iscrowd"]:
        m = grow(masks[a["id"]], -2)
        if m.sum():
            dets.append(det(a["image_id"], a["category_id"], m, 0.77))
for d in dets[::5]:
    d["score"] = 0.5  # ties across and within images
# > 100 detections in one image: weak false positives and, below them all,
# exact copies of its GTs (cut at 100, they are lost)
im = next(x for x in images if any(a["image_id"] == x["id"] and not a["iscrowd"] for a in anns))
mine = [a for a in anns if a["image_id"] == im["id"] and not a["iscrowd"]]
dets = [d for d in dets if d["image_id"] != im["id"]]
for a in mine:
    dets.append(det(im["id"], a["category_id"], masks[a["id"]], 0.001))
for _ in range(120):
    m = np.zeros((im["height"], im["width"]), np.uint8)
    x0, y0 = rng.randint(0, im["width"] - 3), rng.randint(0, im["height"] - 3)
    m[y0:y0 + rng.randint(2, 12), x0:x0 + rng.randint(2, 12)] = 1
    dets.append(det(im["id"], mine[0]["category_id"], m, round(rng.uniform(0.01, 0.3), 3)))
rng.shuffle(dets)

with open(os.path.join(HERE, "coco_segm_gt.json"), "w") as f:
    json.dump({"images": images, "annotations": anns, "categories": cats}, f)
with open(os.path.join(HERE, "coco_segm_dt.json"), "w") as f:
    json.dump(dets, f)

stats = write_stats(HERE, "coco_segm_gt.json", "coco_segm_dt.json", "segm", "coco_segm_stats.txt",
                    "gen_coco_segm.py")
print(len(images), "images", len(anns), "annotations", len(dets), "detections")
print("stats", [round(float(s), 4) for s in stats])
