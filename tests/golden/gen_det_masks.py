#!/usr/bin/python3
"""Golden mask resizes and Mask R-CNN mask targets for tests/test_det_masks.c,
made by PyTorch + torchvision 0.14 (Debian's python3-torch, python3-torchvision):
    /usr/bin/python3 tests/golden/gen_det_masks.py
writes tests/golden/det_masks.bin (PSGOLD1 records, psgold.py):
  rs<i>_in (i32 ih x iw), rs<i>_out (i32 oh x ow): a 0/1 mask through
      F.interpolate(mode="nearest", size=(oh, ow)), as GeneralizedRCNNTransform
      resizes target masks (up, down, 2x, unchanged, odd ratios);
  mt<i>_masks (i32 K x H x W), mt<i>_boxes (f32 N x 4), mt<i>_idx (i32 N),
  mt<i>_M (i32 1), mt<i>_out (f32 N x M x M): torchvision's own
      roi_heads.project_masks_on_boxes(masks, boxes, idx, M), for boxes inside,
      across and beyond the mask's edges, thinner than a pixel, larger than
      the image, and at M = 28, 14, 7, 5;
  ps<i>_prob (f32 N x M x M), ps<i>_boxes (f32 N x 4), ps<i>_hw (i32 2),
  ps<i>_out (f32 N x h x w): torchvision's paste_masks_in_image of mask
      probabilities into an h x w image (Mask R-CNN inference), boxes inside,
      across every edge, smaller than a pixel, larger than the image, with
      fractional and integral corners (not wholly beyond the image: there
      torchvision's slices go negative -- an error or a wrong region --,
      which its clipped detections never meet; test_det_masks checks that
      ours are empty).
"""
import os

import numpy as np
import psgold
import torch
import torch.nn.functional as F
from torchvision.models.detection.roi_heads import paste_masks_in_image, project_masks_on_boxes

torch.manual_seed(20261205)
rng = np.random.RandomState(20261205)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "det_masks.bin")
records = []


def put(name, a, code):
    records.append((name, code, a))


def blobs(h, w):
    m = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(rng.randint(1, 4)):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(1, max(h, w) / 2)
        m |= ((xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= r * r).astype(np.uint8)
    m[rng.randint(0, h), rng.randint(0, w)] ^= 1
    return m


sizes = [((19, 27), (38, 54)), ((20, 30), (20, 30)), ((49, 65), (32, 43)), ((32, 24), (64, 48)),
         ((25, 25), (16, 16)), ((9, 45), (64, 10)), ((40, 40), (39, 41)), ((3, 100), (2, 67))]
for i, ((ih, iw), (oh, ow)) in enumerate(sizes):
    m = blobs(ih, iw)
    out = F.interpolate(torch.from_numpy(m)[None, None].float(), size=(oh, ow))[0, 0].byte()
    put("rs%d_in" % i, m, 1)
    put("rs%d_out" % i, out.numpy(), 1)

cases = [((48, 64), 28), ((70, 90), 28), ((30, 41), 14), ((64, 64), 7), ((20, 25), 5)]
for i, ((h, w), M) in enumerate(cases):
    K = 2
    masks = np.stack([blobs(h, w) for _ in range(K)])
    boxes = []
    for _ in range(8):  # inside
        x1, y1 = rng.uniform(0, w - 2), rng.uniform(0, h - 2)
        boxes.append([x1, y1, x1 + rng.uniform(1, w - x1), y1 + rng.uniform(1, h - y1)])
    boxes += [[-5.5, -3.2, w * 0.4, h * 0.5],         # across the top-left edge
              [w * 0.6, h * 0.7, w + 7.3, h + 2.1],  # across the bottom-right edge
              [w + 2.0, 1.0, w + 9.0, 6.0],          # beyond the right edge
              [-9.0, -9.0, -1.5, -2.0],              # beyond the top-left corner
              [3.3, 4.1, 3.5, 4.4],                  # thinner than a pixel
              [5.0, 5.0, 4.0, 9.0],                  # x2 < x1
              [-20.0, -30.0, w + 25.0, h + 40.0],    # larger than the image
              [0.0, 0.0, float(w), float(h)],        # the whole image
              [w - 1.0, h - 1.0, w + 0.0, h + 0.0],  # the last pixel
              [0.5, 0.5, 200.0, 1.5]]                # long and flat
    boxes = torch.tensor(boxes, dtype=torch.float32)
    idx = torch.from_numpy(rng.randint(0, K, size=len(boxes))).long()
    out = project_masks_on_boxes(torch.from_numpy(masks), boxes, idx, M)
    put("mt%d_masks" % i, masks, 1)
    put("mt%d_boxes" % i, boxes.numpy(), 0)
    put("mt%d_idx" % i, idx.numpy(), 1)
    put("mt%d_M" % i, np.array([M]), 1)
    put("mt%d_out" % i, out.numpy(), 0)

for i, ((h, w), M) in enumerate([((40, 50), 28), ((33, 27), 28), ((17, 23), 14)]):
    boxes = [[3.2, 4.7, 30.9, 25.1], [0.0, 0.0, float(w), float(h)],
             [-6.5, -4.2, w * 0.5, h * 0.4], [w * 0.6, h * 0.5, w + 5.5, h + 3.7],
             [10.2, 11.3, 10.6, 11.5], [9.0, 7.0, 9.0, 7.0], [-30.0, -20.0, w + 40.0, h + 25.0],
             [1.0, 2.0, 21.0, 12.0], [w - 1.5, h - 1.5, w - 0.2, h - 0.3]]
    for _ in range(4):
        x1, y1 = rng.uniform(-2, w - 2), rng.uniform(-2, h - 2)
        boxes.append([x1, y1, x1 + rng.uniform(1, w), y1 + rng.uniform(1, h)])
    boxes = torch.tensor(boxes, dtype=torch.float32)
    prob = torch.rand(len(boxes), 1, M, M)
    out = paste_masks_in_image(prob, boxes, (h, w), padding=1)
    put("ps%d_prob" % i, prob[:, 0].numpy(), 0)
    put("ps%d_boxes" % i, boxes.numpy(), 0)
    put("ps%d_hw" % i, np.array([h, w]), 1)
    put("ps%d_out" % i, out[:, 0].numpy(), 0)

psgold.write(OUT, records)
print(len(records), "records ->", OUT)
