#!/usr/bin/python3
"""Golden data for tests/test_video_data.c from PIL (the library TSM's
transforms use).  Run once with Debian's /usr/bin/python3 (python3-pil,
python3-numpy); writes, under tests/golden/:

  video_resize.bin   u8 input image 37x29 RGB, then each case's PIL output
  video_resize.txt   one line per case: x y w h out_w out_h byte_offset
                     (Image.crop((x, y, x+w, y+h)).resize((out_w, out_h),
                     BILINEAR), i.e. GroupMultiScaleCrop's crop + resize)
  video_q75.jpg      a 40x32 colour JPEG written by PIL (quality 75, 4:2:0)
  video_gray.jpg     a 40x32 greyscale JPEG
  video_jpeg.bin     PIL's decode of both, .convert('RGB'), u8 h*w*3 each
  video/vid_a/img_0000{1..6}.jpg, video/list.txt
                     a 6-frame 40x30 clip and its TSM list line
  video_val.bin      f32 (T=4, 3, 24, 24): TSM's test transform of vid_a:
                     _get_val_indices, GroupScale(28) (shorter side),
                     GroupCenterCrop(24), /255, ImageNet mean/std
"""
import os

import numpy as np
from PIL import Image

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261129)

# ---- resize ----------------------------------------------------------------
img = rng.integers(0, 256, (29, 37, 3), dtype=np.uint8)
cases = [(0, 0, 37, 29, 16, 12), (0, 0, 37, 29, 50, 40), (3, 2, 23, 20, 16, 16),
         (5, 4, 11, 9, 11, 9), (0, 0, 37, 29, 37, 10), (0, 0, 37, 29, 8, 29),
         (6, 1, 30, 27, 13, 13)]
blob = bytearray(img.tobytes())
lines = []
for x, y, w, h, ow, oh in cases:
    out = Image.fromarray(img).crop((x, y, x + w, y + h)).resize((ow, oh), Image.BILINEAR)
    lines.append("%d %d %d %d %d %d %d" % (x, y, w, h, ow, oh, len(blob)))
    blob += np.asarray(out).tobytes()
open(os.path.join(here, "video_resize.bin"), "wb").write(bytes(blob))
open(os.path.join(here, "video_resize.txt"), "w").write("\n".join(lines) + "\n")

# ---- JPEG ------------------------------------------------------------------
yy, xx = np.mgrid[0:32, 0:40]
col = np.stack([xx * 6, yy * 7, (xx + yy) * 3], -1).astype(np.uint8)
col[8:20, 10:25] = (200, 30, 60)
Image.fromarray(col).save(os.path.join(here, "video_q75.jpg"), quality=75)
Image.fromarray(col[:, :, 1]).save(os.path.join(here, "video_gray.jpg"), quality=90)
dec = b""
for n in ("video_q75.jpg", "video_gray.jpg"):
    dec += np.asarray(Image.open(os.path.join(here, n)).convert("RGB")).tobytes()
open(os.path.join(here, "video_jpeg.bin"), "wb").write(dec)

# ---- a clip through TSM's test transform ----------------------------------
vdir = os.path.join(here, "video", "vid_a")
os.makedirs(vdir, exist_ok=True)
F, T, crop, scale = 6, 4, 24, 28
for t in range(F):
    fr = np.zeros((30, 40, 3), np.uint8)
    fr[:] = rng.integers(0, 256, 3, dtype=np.uint8)
    fr[5:20, 3 + 4 * t:15 + 4 * t] = (250, 250, 20)
    fr += (rng.integers(0, 40, (30, 40, 3), dtype=np.uint8))
    Image.fromarray(fr).save(os.path.join(vdir, "img_%05d.jpg" % (t + 1)), quality=85)
open(os.path.join(here, "video", "list.txt"), "w").write("vid_a %d 1\n" % F)
if F > T:
    tick = F / float(T)
    idx = [int(tick / 2.0 + tick * x) + 1 for x in range(T)]
else:
    idx = [1] * T
mean = np.array([0.485, 0.456, 0.406], np.float32)
std = np.array([0.229, 0.224, 0.225], np.float32)
out = []
for i in idx:
    im = Image.open(os.path.join(vdir, "img_%05d.jpg" % i)).convert("RGB")
    w, h = im.size
    if w < h:
        ow, oh = scale, int(scale * h / w)
    else:
        oh, ow = scale, int(scale * w / h)
    im = im.resize((ow, oh), Image.BILINEAR)
    top, left = int(round((oh - crop) / 2.0)), int(round((ow - crop) / 2.0))
    im = im.crop((left, top, left + crop, top + crop))
    a = np.asarray(im).astype(np.float32) / np.float32(255)
    a = (a - mean) / std
    out.append(a.transpose(2, 0, 1))
np.stack(out).astype(np.float32).tofile(os.path.join(here, "video_val.bin"))
print("indices", idx)
