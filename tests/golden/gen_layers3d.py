#!/usr/bin/python3
"""Golden tensors for tests/test_layers3d.c, made by PyTorch (float32, fixed seed).

Run once with Debian's interpreter (python3-torch), from the source root:
    /usr/bin/python3 tests/golden/gen_layers3d.py
and commit tests/golden/layers3d_golden.bin.  The test never needs torch.

Same record format as gen_layers.py (PSGOLD1, read by tests/lib/golden_io.h).
Every case stores its configuration as an i32 "<case>.cfg" record, its inputs
and parameters, the forward outputs, a random upstream gradient "<case>.dout"
and the gradients PyTorch's autograd computes from it.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psgold import put, rnd, write  # noqa: E402

torch.manual_seed(20261212)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers3d_golden.bin")


# ---- conv3d: N C D H W K  KT R S  st sh sw  pt ph pw  dt dh dw  groups bias ----
conv_cases = [
    (2, 3, 5, 6, 5, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),  # 3x3x3 pad 1, bias (R3D)
    (2, 3, 6, 7, 6, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0),  # 3x3x3 stride 2
    (2, 5, 3, 4, 5, 6, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1),  # 1x1x1 (straight GEMM)
    (2, 4, 4, 7, 6, 6, 1, 1, 1, 1, 2, 2, 0, 0, 0, 1, 1, 1, 1, 0),  # 1x1x1 stride 1,2,2 (downsample)
    (1, 3, 6, 13, 12, 4, 5, 7, 7, 1, 2, 2, 2, 3, 3, 1, 1, 1, 1, 0),  # 5x7x7 stem (I3D)
    (2, 4, 5, 4, 3, 5, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0),  # 3x1x1 (I3D 3x1x1, (2+1)D)
    (2, 4, 3, 7, 7, 5, 1, 3, 3, 1, 2, 2, 0, 1, 1, 1, 1, 1, 1, 1),  # 1x3x3 stride 1,2,2 (MC3)
    (2, 3, 7, 6, 7, 4, 3, 3, 2, 1, 1, 2, 2, 1, 1, 2, 1, 2, 1, 1),  # dilation 2,1,2
    (2, 4, 4, 5, 5, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1),  # groups 2
    (3, 4, 4, 6, 6, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 4, 0),  # depthwise, stride 2
    (2, 3, 6, 5, 4, 4, 3, 1, 1, 2, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0),  # temporal stride only
]
for i, c in enumerate(conv_cases):
    N, C, D, H, W, K, KT, R, S, st, sh, sw, pt, ph, pw, dt, dh, dw, g, bias = c
    p = "conv3d.%d." % i
    x = rnd(N, C, D, H, W)
    w = rnd(K, C // g, KT, R, S, scale=0.3)
    b = rnd(K) if bias else None
    y = F.conv3d(x, w, b, stride=(st, sh, sw), padding=(pt, ph, pw), dilation=(dt, dh, dw),
                 groups=g)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", list(c))
    put(p + "x", x); put(p + "w", w)
    if bias:
        put(p + "b", b); put(p + "db", b.grad)
    put(p + "out", y); put(p + "dout", dy); put(p + "dx", x.grad); put(p + "dw", w.grad)

# ---- max pool 3-d: N C D H W  KT R S  st sh sw  pt ph pw ----
maxpool_cases = [
    (2, 3, 4, 9, 8, 1, 3, 3, 1, 2, 2, 0, 1, 1),  # I3D pool1 (1x3x3, stride 1,2,2)
    (2, 3, 6, 5, 4, 2, 1, 1, 2, 1, 1, 0, 0, 0),  # I3D pool2 (2x1x1, stride 2,1,1)
    (1, 2, 5, 6, 7, 3, 3, 3, 2, 2, 2, 1, 1, 1),  # 3x3x3 stride 2 pad 1 (overlapping)
]
for i, c in enumerate(maxpool_cases):
    N, C, D, H, W, KT, R, S, st, sh, sw, pt, ph, pw = c
    p = "maxpool3d.%d." % i
    x = rnd(N, C, D, H, W)
    y, idx = F.max_pool3d(x, (KT, R, S), (st, sh, sw), (pt, ph, pw), return_indices=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", list(c))
    put(p + "x", x); put(p + "out", y); put(p + "idx", idx)
    put(p + "dout", dy); put(p + "dx", x.grad)

# ---- average pool 3-d: N C D H W  KT R S  st sh sw  pt ph pw  count_include_pad ----
avgpool_cases = [
    (2, 3, 4, 6, 6, 2, 2, 2, 2, 2, 2, 0, 0, 0, 1),
    (1, 2, 5, 7, 6, 3, 3, 3, 1, 2, 2, 1, 1, 1, 1),
    (1, 2, 5, 7, 6, 3, 3, 3, 1, 2, 2, 1, 1, 1, 0),
]
for i, c in enumerate(avgpool_cases):
    N, C, D, H, W, KT, R, S, st, sh, sw, pt, ph, pw, cip = c
    p = "avgpool3d.%d." % i
    x = rnd(N, C, D, H, W)
    y = F.avg_pool3d(x, (KT, R, S), (st, sh, sw), (pt, ph, pw), count_include_pad=bool(cip))
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", list(c))
    put(p + "x", x); put(p + "out", y); put(p + "dout", dy); put(p + "dx", x.grad)

# ---- batchnorm3d (N, C, D, H, W), train and eval: the 2-D slots, HW = D*H*W ----
N, C, D, H, W = 3, 4, 3, 4, 5
eps, mom = 1e-5, 0.1
x = rnd(N, C, D, H, W, scale=2.0)
with torch.no_grad():
    x += torch.arange(C).view(1, C, 1, 1, 1) * 1.5
gamma, beta = rnd(C), rnd(C)
rm0, rv0 = torch.randn(C), torch.rand(C) + 0.5
rm, rv = rm0.clone(), rv0.clone()
y = F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=mom, eps=eps)
dy = torch.randn_like(y)
y.backward(dy)
put("bn3d_train.cfg", [N, C, D, H, W])
put("bn3d_train.x", x); put("bn3d_train.gamma", gamma); put("bn3d_train.beta", beta)
put("bn3d_train.rm0", rm0); put("bn3d_train.rv0", rv0); put("bn3d_train.out", y)
put("bn3d_train.rm1", rm); put("bn3d_train.rv1", rv)
put("bn3d_train.dout", dy); put("bn3d_train.dx", x.grad)
put("bn3d_train.dgamma", gamma.grad); put("bn3d_train.dbeta", beta.grad)

x = rnd(N, C, D, H, W)
gamma, beta = rnd(C), rnd(C)
rm, rv = torch.randn(C), torch.rand(C) + 0.5
y = F.batch_norm(x, rm, rv, gamma, beta, training=False, eps=eps)
dy = torch.randn_like(y)
y.backward(dy)
put("bn3d_eval.cfg", [N, C, D, H, W])
put("bn3d_eval.x", x); put("bn3d_eval.gamma", gamma); put("bn3d_eval.beta", beta)
put("bn3d_eval.rm", rm); put("bn3d_eval.rv", rv); put("bn3d_eval.out", y)
put("bn3d_eval.dout", dy); put("bn3d_eval.dx", x.grad)
put("bn3d_eval.dgamma", gamma.grad); put("bn3d_eval.dbeta", beta.grad)

# ---- global average pool over T x H x W (AdaptiveAvgPool3d(1)) ----
x = rnd(2, 5, 3, 4, 3)
y = F.adaptive_avg_pool3d(x, 1).flatten(1)
dy = torch.randn_like(y)
y.backward(dy)
put("gap3d.cfg", [2, 5, 3, 4, 3])
put("gap3d.x", x); put("gap3d.out", y); put("gap3d.dout", dy); put("gap3d.dx", x.grad)

write(OUT)
