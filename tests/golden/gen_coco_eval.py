#!/usr/bin/python3
"""Golden COCO evaluation for tests/test_coco_eval.c, made with pycocotools.

pycocotools is not a Debian package here; it was installed from PyPI into a
throw-away venv that sees Debian's numpy:
    /usr/bin/python3 -m venv --system-site-packages /tmp/venv-coco
    /tmp/venv-coco/bin/pip install pycocotools        # 2.0.11 (builds with gcc)
    /tmp/venv-coco/bin/python tests/golden/gen_coco_eval.py
Writes tests/golden/coco_gt.json (20 images of varied sizes; crowd boxes;
'area' differing from w*h as for segmentation areas; a category without any
ground truth; images without annotations), tests/golden/coco_dt.json
(jittered true positives, duplicates, false positives, scores tied across
images, one image with more than 100 detections) and tests/golden/
coco_stats.txt: the 12 COCOeval.stats (bbox) printed with repr, plus the
per-category AP (IoU .5:.95, area all, maxDets 100) as "cat <id> <ap>".
"""
import json
import os
import random

from coco_golden import write_stats

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261129)

cats = [{"id": c, "name": n} for c, n in ((1, "circle"), (2, "square"), (3, "triangle"),
                                          (7, "never_annotated"))]
images, anns, dets = [], [], []
aid = 1
for i in range(20):
    w, h = rng.choice([(320, 240), (640, 480), (200, 300), (500, 500), (97, 131)])
    img_id = 1000 - 7 * i  # ids not in file order: evaluation sorts them
    images.append({"id": img_id, "width": w, "height": h, "file_name": "%06d.jpg" % img_id})
    if i in (4, 11):
        continue  # images without annotations
    for _ in range(rng.randint(1, 9)):
        # sizes spanning small (< 32^2), medium and large (> 96^2)
        bw = min(w - 1, rng.choice([rng.uniform(4, 30), rng.uniform(30, 90), rng.uniform(90, 250)]))
        bh = min(h - 1, bw * rng.uniform(0.5, 2.0))
        x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        crowd = 1 if rng.random() < 0.12 else 0
        cat = rng.choice([1, 2, 3])
        area = bw * bh * rng.uniform(0.5, 1.0)  # like a segmentation area
        anns.append({"id": aid, "image_id": img_id, "category_id": cat,
                     "bbox": [round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)],
                     "area": round(area, 3), "iscrowd": crowd})
        aid += 1
        if rng.random() < 0.3:
            # an overlapping GT of the same class (crowd, or of another area range):
            # exercises crowd re-matching and "never leave a regular GT for an ignored one"
            s = rng.uniform(1.05, 1.3)
            ow, oh = min(bw * s, w - x), min(bh * s, h - y)
            anns.append({"id": aid, "image_id": img_id, "category_id": cat,
                         "bbox": [round(x, 2), round(y, 2), round(ow, 2), round(oh, 2)],
                         "area": round(ow * oh * rng.uniform(0.3, 1.0), 3),
                         "iscrowd": 1 if rng.random() < 0.5 else 0})
            aid += 1
        # detections for this object: a good one, sometimes a duplicate, sometimes a miss
        for k in range(rng.choice([0, 1, 1, 1, 2, 3])):
            j = 0.03 + 0.12 * k
            dx, dy = rng.gauss(0, j) * bw, rng.gauss(0, j) * bh
            sw, sh = bw * (1 + rng.gauss(0, j)), bh * (1 + rng.gauss(0, j))
            dcat = cat if rng.random() < 0.9 else rng.choice([1, 2, 3, 7])
            dets.append({"image_id": img_id, "category_id": dcat,
                         "bbox": [round(x + dx, 2), round(y + dy, 2), round(max(sw, 1), 2),
                                  round(max(sh, 1), 2)],
                         "score": round(rng.uniform(0.05, 1.0), 3)})
    # false positives
    for _ in range(rng.randint(0, 6)):
        bw, bh = rng.uniform(5, w / 2), rng.uniform(5, h / 2)
        dets.append({"image_id": img_id, "category_id": rng.choice([1, 2, 3, 7]),
                     "bbox": [round(rng.uniform(0, w - bw), 2), round(rng.uniform(0, h - bh), 2),
                              round(bw, 2), round(bh, 2)],
                     "score": round(rng.uniform(0.05, 0.6), 3)})
# scores tied across images and within an image (stable ordering matters)
for d in dets[::5]:
    d["score"] = 0.5
# one image with > 100 detections of one class (maxDets truncation): 130 weak
# false positives, and exact copies of its GTs scored below all of them, so
# cutting at 100 per image changes recall
img = images[2]
mine = [a for a in anns if a["image_id"] == img["id"]]
dets = [d for d in dets if d["image_id"] != img["id"]]
for a in mine:
    dets.append({"image_id": img["id"], "category_id": a["category_id"], "bbox": list(a["bbox"]),
                 "score": 0.001})
for _ in range(130):
    bw, bh = rng.uniform(5, 60), rng.uniform(5, 60)
    dets.append({"image_id": img["id"], "category_id": mine[0]["category_id"],
                 "bbox": [round(rng.uniform(0, img["width"] - bw), 2),
                          round(rng.uniform(0, img["height"] - bh), 2), round(bw, 2), round(bh, 2)],
                 "score": round(rng.uniform(0.01, 0.3), 3)})
rng.shuffle(dets)

gt_json = {"images": images, "annotations": anns, "categories": cats}
with open(os.path.join(HERE, "coco_gt.json"), "w") as f:
    json.dump(gt_json, f, indent=0)
with open(os.path.join(HERE, "coco_dt.json"), "w") as f:
    json.dump(dets, f, indent=0)

stats = write_stats(HERE, "coco_gt.json", "coco_dt.json", "bbox", "coco_stats.txt",
                    "gen_coco_eval.py")
print(len(images), "images", len(anns), "annotations", len(dets), "detections")
print("stats", [round(float(s), 4) for s in stats])
