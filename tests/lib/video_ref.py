"""TSM's test-time video pipeline in numpy + PIL, written from TSM's
dataset and transform code's documented behaviour, independently of the C
loader: the reference the checks compare psworker's --eval with
(tests/tools/check_export_torch.py, check_onnx.py, check_test_protocol.py,
check_tsm_import.py).

  segment indices  TSNDataSet._get_val_indices: the centre of each of the
                   T spans (tick = F / T), 1-based; clip c of n shifts the
                   point inside each span to tick * (c + 0.5) / n (one clip:
                   tick / 2, TSM's own)
  scale            GroupScale(s): the shorter side to s with PIL BILINEAR,
                   the longer int(s * long / short)
  crops            GroupCenterCrop: offsets int(round((side - crop) / 2));
                   GroupFullResSample (no flip): step = (side - crop) // 4 on
                   both axes, crops at (0, 2), (4, 2), (2, 2) steps (left,
                   right, centre) -- along the longer side here (TSM always
                   steps along the width, which gives a portrait frame three
                   identical crops)
  normalise        /255, ImageNet mean / std, CHW float32
A clip is (T, 3, crop, crop); a video's views are clip-major: view
clip * n_crops + crop.
"""
import os

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def test_indices(F, T, clip=0, n_clips=1):
    """1-based frame of each segment."""
    if F > T:
        tick = F / float(T)
        start = tick * (clip + 0.5) / n_clips
        return [int(start + tick * x) + 1 for x in range(T)]
    return [1] * T


def val_indices(F, T):
    """TSM's _get_val_indices (new_length 1), 1-based."""
    return test_indices(F, T, 0, 1)


def scale_shorter(im, s):
    w, h = im.size
    if (w <= h and w == s) or (h <= w and h == s):
        return im
    if w < h:
        ow, oh = s, int(s * h / w)
    else:
        oh, ow = s, int(s * w / h)
    return im.resize((ow, oh), Image.BILINEAR)


def crop_offsets(w, h, crop, n_crops):
    """(left, top) of each crop of a w x h frame."""
    if n_crops == 1:
        return [(int(round((w - crop) / 2.0)), int(round((h - crop) / 2.0)))]
    ws, hs = (w - crop) // 4, (h - crop) // 4
    if w >= h:
        return [(0, 2 * hs), (4 * ws, 2 * hs), (2 * ws, 2 * hs)]
    return [(2 * ws, 0), (2 * ws, 4 * hs), (2 * ws, 2 * hs)]


def normalise(im):
    a = np.asarray(im.convert("RGB")).astype(np.float32) / np.float32(255)
    return ((a - MEAN) / STD).transpose(2, 0, 1)


def load_views(d, F, T, scale, crop, tmpl="img_%05d.jpg", n_clips=1, n_crops=1):
    """Every view of a video: (n_clips * n_crops, T, 3, crop, crop)."""
    views = np.zeros((n_clips * n_crops, T, 3, crop, crop), np.float32)
    for c in range(n_clips):
        for t, i in enumerate(test_indices(F, T, c, n_clips)):
            im = scale_shorter(Image.open(os.path.join(d, tmpl % i)).convert("RGB"), scale)
            for k, (x, y) in enumerate(crop_offsets(im.size[0], im.size[1], crop, n_crops)):
                views[c * n_crops + k, t] = normalise(im.crop((x, y, x + crop, y + crop)))
    return views


def load_clip(d, F, T, scale, crop, tmpl="img_%05d.jpg"):
    """TSM's one-clip centre-crop test input: (T, 3, crop, crop)."""
    return load_views(d, F, T, scale, crop, tmpl)[0]


def read_list(path):
    """TSM list lines: (frame_dir, num_frames, label)."""
    out = []
    for line in open(path):
        f = line.split()
        if f:
            out.append((" ".join(f[:-2]), int(f[-2]), int(f[-1])))
    return out


def read_predictions(path):
    """psworker --predictions CSV: {index: (video, label, pred, logits)}."""
    rows = [l.split(",") for l in open(path).read().splitlines()]
    return rows[0], {int(r[0]): (r[1], int(r[2]), int(r[3]), np.array([float(v) for v in r[4:]]))
                     for r in rows[1:]}


def final_kv(path):
    """The key=value pairs of a psworker "final:" line."""
    for line in open(path):
        if line.startswith("final:"):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return {}


def rank_of(t, y):
    """Rank of label y in logits t (ties broken by index, as psworker)."""
    return sum(1 for c in range(len(t)) if t[c] > t[y] or (t[c] == t[y] and c < y))
