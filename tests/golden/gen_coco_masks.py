#!/usr/bin/python3
"""Golden RLE mask operations for tests/test_coco_mask.c, made with pycocotools.

pycocotools comes from PyPI, in a venv that sees Debian's numpy:
    /usr/bin/python3 -m venv --system-site-packages /tmp/venv-coco
    /tmp/venv-coco/bin/pip install pycocotools        # 2.0.11
    /tmp/venv-coco/bin/python tests/golden/gen_coco_masks.py
Writes tests/golden/coco_masks.txt, one case per line (numbers with repr,
masks as compressed RLE strings):
  poly H W N  K1 x y x y ...  K2 ...  RLE AREA BX BY BW BH
      frPyObjects of N polygons (K points each) merged (union), its area and
      toBbox; polygons are random (star-shaped, self-intersecting, thin,
      poking out of the image, on pixel edges and centres);
  encode H W BITS RLE AREA BX BY BW BH
      encode of an H x W mask given row by row as '0'/'1' characters;
  ucrle H W M C1 .. CM RLE
      frPyObjects of an uncompressed RLE (counts list), as a string;
  merge H W INTERSECT N RLE1 .. RLEN RESULT
  iou H W ND NG DT1 .. GT1 .. CROWD1 .. IOU(d=0,g=0) IOU(0,1) ...
"""
import os
import random

import numpy as np
import pycocotools.mask as mu
from coco_golden import counts_str as rs

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261203)


def coord(v):
    # a mix of COCO-like 2-decimal values, exact pixel edges / centres and
    # values near the 1/5-pixel rounding points
    k = rng.random()
    if k < 0.5:
        return round(v, 2)
    if k < 0.7:
        return float(round(v))
    if k < 0.85:
        return round(v) + 0.5
    return round(v * 5) / 5 + rng.choice([-1e-9, 0.0, 1e-9, 0.1])


def polygon(h, w):
    kind = rng.random()
    k = rng.randint(3, 14)
    if kind < 0.55:  # star-shaped around a centre, may poke out of the image
        cx, cy = rng.uniform(-0.2 * w, 1.2 * w), rng.uniform(-0.2 * h, 1.2 * h)
        r0 = rng.uniform(0.5, 0.6 * max(h, w))
        angs = sorted(rng.uniform(0, 2 * np.pi) for _ in range(k))
        pts = []
        for a in angs:
            r = r0 * rng.uniform(0.3, 1.0)
            pts += [coord(cx + r * np.cos(a)), coord(cy + r * np.sin(a))]
        return pts
    if kind < 0.8:  # random points: self-intersecting
        return [coord(rng.uniform(-2, w + 2)) if i % 2 == 0 else coord(rng.uniform(-2, h + 2))
                for i in range(2 * k)]
    if kind < 0.9:  # thin sliver
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        dx, dy = rng.uniform(-w, w), rng.uniform(-h, h)
        e = rng.uniform(0.05, 0.8)
        return [coord(x), coord(y), coord(x + dx), coord(y + dy), coord(x + dx + e), coord(y + dy + e)]
    # an axis-aligned rectangle on pixel edges
    x0, y0 = rng.randint(-2, w), rng.randint(-2, h)
    x1, y1 = x0 + rng.randint(1, w), y0 + rng.randint(1, h)
    return [float(x0), float(y0), float(x1), float(y0), float(x1), float(y1), float(x0), float(y1)]


def fmt(v):
    return repr(float(v))


def box(r):
    return " ".join(fmt(v) for v in mu.toBbox(r))


lines = []
sizes = [(1, 1), (1, 17), (13, 1), (7, 9), (20, 20), (31, 47), (64, 48), (100, 3), (3, 100)]
for case in range(260):
    h, w = sizes[case % len(sizes)] if case < 60 else (rng.randint(1, 70), rng.randint(1, 70))
    n = 1 if rng.random() < 0.6 else rng.randint(2, 4)
    polys = [polygon(h, w) for _ in range(n)]
    r = mu.merge(mu.frPyObjects(polys, h, w))
    parts = ["poly", str(h), str(w), str(n)]
    for p in polys:
        parts.append(str(len(p) // 2))
        parts += [fmt(v) for v in p]
    parts += [rs(r), str(int(mu.area(r))), box(r)]
    lines.append(" ".join(parts))

def blob_mask(h, w, density):
    m = np.zeros((h, w), np.uint8)
    for _ in range(rng.randint(0, 4)):
        cx, cy, rr = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.5, max(h, w) / 2)
        yy, xx = np.mgrid[0:h, 0:w]
        m |= ((xx - cx) ** 2 + (yy - cy) ** 2 <= rr * rr).astype(np.uint8)
    noise = np.array([[1 if rng.random() < density else 0 for _ in range(w)] for _ in range(h)],
                     np.uint8)
    return m ^ noise


masks = []
for case in range(60):
    h, w = (rng.randint(1, 40), rng.randint(1, 40))
    m = blob_mask(h, w, rng.choice([0, 0, 0.02, 0.3]))
    if case == 0:
        m[:] = 0
    if case == 1:
        m[:] = 1
    r = mu.encode(np.asfortranarray(m))
    bits = "".join("".join(str(int(v)) for v in row) for row in m)
    lines.append("encode %d %d %s %s %d %s" % (h, w, bits, rs(r), int(mu.area(r)), box(r)))
    masks.append((h, w, r))

# large images: counts needing several characters, negative differences
for h, w in ((480, 640), (1000, 1500), (2, 70000)):
    m = np.zeros((h, w), np.uint8)
    m[h // 3: h // 2 + 1, w // 5: w - 3] = 1
    m[0, w - 1] = 1
    r = mu.encode(np.asfortranarray(m))
    lines.append("encode_box %d %d %d %d %d %d %s %d %s" % (
        h, w, h // 3, h // 2 + 1, w // 5, w - 3, rs(r), int(mu.area(r)), box(r)))

for case in range(30):
    h, w = rng.randint(1, 30), rng.randint(1, 30)
    total, cnts = h * w, []
    while total > 0:
        c = min(total, rng.randint(0, max(1, total // 3)) if cnts else rng.randint(0, total))
        cnts.append(c)
        total -= c
    if len(cnts) % 2 == 0 and rng.random() < 0.5:
        cnts.append(0)  # a trailing empty run, as some tools write
    r = mu.frPyObjects({"counts": cnts, "size": [h, w]}, h, w)
    lines.append("ucrle %d %d %d %s %s" % (h, w, len(cnts), " ".join(map(str, cnts)), rs(r)))

for case in range(60):
    h, w = rng.randint(1, 40), rng.randint(1, 40)
    n = rng.randint(2, 4)
    rl = [mu.encode(np.asfortranarray(blob_mask(h, w, rng.choice([0, 0.05])))) for _ in range(n)]
    inter = case % 2
    r = mu.merge(rl, intersect=bool(inter))
    lines.append("merge %d %d %d %d %s %s" % (h, w, inter, n, " ".join(rs(x) for x in rl), rs(r)))

for case in range(50):
    h, w = rng.randint(1, 40), rng.randint(1, 40)
    nd, ng = rng.randint(1, 4), rng.randint(1, 4)
    dts = [mu.encode(np.asfortranarray(blob_mask(h, w, rng.choice([0, 0.05])))) for _ in range(nd)]
    gts = [mu.encode(np.asfortranarray(blob_mask(h, w, rng.choice([0, 0.05])))) for _ in range(ng)]
    if case % 5 == 0:
        gts[0] = dts[0]  # identical masks: IoU 1
    crowd = [rng.randint(0, 1) for _ in range(ng)]
    o = mu.iou(dts, gts, crowd)
    o = np.asarray(o).reshape(nd, ng)
    vals = [fmt(o[d][g]) for d in range(nd) for g in range(ng)]
    lines.append("iou %d %d %d %d %s %s %s %s" % (
        h, w, nd, ng, " ".join(rs(x) for x in dts), " ".join(rs(x) for x in gts),
        " ".join(map(str, crowd)), " ".join(vals)))

with open(os.path.join(HERE, "coco_masks.txt"), "w") as f:
    f.write("# pycocotools mask API cases (gen_coco_masks.py)\n")
    f.write("\n".join(lines) + "\n")
print(len(lines), "cases")
