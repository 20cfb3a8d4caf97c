#!/usr/bin/python3
"""Golden tensors for tests/test_layers.c, made by PyTorch (float32, fixed seed).

Run once with Debian's interpreter (python3-torch), from the source root:
    /usr/bin/python3 tests/golden/gen_layers.py
and commit tests/golden/layers_golden.bin.  The test never needs torch.

Format (little-endian): magic b"PSGOLD1\\n", then records until EOF:
    u32 name_len, name (utf-8), u32 dtype (0 = f32, 1 = i32), u32 ndim,
    u32 dims[ndim], data (prod(dims) elements).
Every case stores its configuration as an i32 "<case>.cfg" record, its
inputs and parameters, the forward outputs, a random upstream gradient
"<case>.dout" and the gradients PyTorch's autograd computes from it.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psgold import put, rnd, write  # noqa: E402

torch.manual_seed(20261129)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers_golden.bin")


# ---- conv2d: N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, groups, bias ----
conv_cases = [
    (2, 4, 9, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),   # 3x3 pad 1 stride 1, bias
    (2, 4, 9, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0),   # 3x3 pad 1 stride 2
    (2, 5, 6, 5, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1),   # 1x1 (straight GEMM)
    (2, 4, 9, 7, 6, 1, 1, 2, 2, 0, 0, 1, 1, 1, 0),   # 1x1 stride 2 (ResNet downsample)
    (2, 3, 16, 13, 4, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0), # 7x7 stride 2 pad 3 (stem)
    (2, 4, 9, 8, 6, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1),   # dilation 2
    (2, 4, 8, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1),   # groups 2
    (3, 4, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 0),   # depthwise, stride 2
    (2, 3, 7, 9, 5, 3, 1, 1, 2, 1, 0, 1, 1, 1, 1),   # rectangular kernel/stride
]
for i, (N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, g, bias) in enumerate(conv_cases):
    p = "conv.%d." % i
    x = rnd(N, C, H, W)
    w = rnd(K, C // g, R, S, scale=0.3)
    b = rnd(K) if bias else None
    y = F.conv2d(x, w, b, stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw), groups=g)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", [N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, g, bias])
    put(p + "x", x); put(p + "w", w)
    if bias:
        put(p + "b", b); put(p + "db", b.grad)
    put(p + "out", y); put(p + "dout", dy); put(p + "dx", x.grad); put(p + "dw", w.grad)

# ---- batchnorm2d train: N, C, HW; eps and momentum fixed below ----
N, C, H, W = 4, 3, 5, 6
eps, mom = 1e-5, 0.1
x = rnd(N, C, H, W, scale=2.0)
with torch.no_grad():
    x += torch.arange(C).view(1, C, 1, 1) * 1.5  # non-zero channel means
gamma, beta = rnd(C), rnd(C)
rm0, rv0 = torch.randn(C), torch.rand(C) + 0.5
rm, rv = rm0.clone(), rv0.clone()
y = F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=mom, eps=eps)
dy = torch.randn_like(y)
y.backward(dy)
xd = x.detach().double()
mean = xd.mean(dim=(0, 2, 3))
var = xd.var(dim=(0, 2, 3), unbiased=False)
put("bn_train.cfg", [N, C, H * W])
put("bn_train.x", x); put("bn_train.gamma", gamma); put("bn_train.beta", beta)
put("bn_train.rm0", rm0); put("bn_train.rv0", rv0)
put("bn_train.out", y); put("bn_train.mean", mean); put("bn_train.rstd", 1.0 / torch.sqrt(var + eps))
put("bn_train.rm1", rm); put("bn_train.rv1", rv)
put("bn_train.dout", dy); put("bn_train.dx", x.grad)
put("bn_train.dgamma", gamma.grad); put("bn_train.dbeta", beta.grad)

# ---- batchnorm2d eval (running statistics) ----
x = rnd(N, C, H, W)
gamma, beta = rnd(C), rnd(C)
rm, rv = torch.randn(C), torch.rand(C) + 0.5
y = F.batch_norm(x, rm, rv, gamma, beta, training=False, eps=eps)
dy = torch.randn_like(y)
y.backward(dy)
put("bn_eval.cfg", [N, C, H * W])
put("bn_eval.x", x); put("bn_eval.gamma", gamma); put("bn_eval.beta", beta)
put("bn_eval.rm", rm); put("bn_eval.rv", rv); put("bn_eval.out", y)
put("bn_eval.dout", dy); put("bn_eval.dx", x.grad)
put("bn_eval.dgamma", gamma.grad); put("bn_eval.dbeta", beta.grad)

# ---- relu ----
x = rnd(3, 4, 5)
y = F.relu(x)
dy = torch.randn_like(y)
y.backward(dy)
put("relu.cfg", [x.numel()])
put("relu.x", x); put("relu.out", y); put("relu.dout", dy); put("relu.dx", x.grad)

# ---- max pool: N, C, H, W, R, S, sh, sw, ph, pw ----
pool_cases = [(2, 3, 9, 8, 3, 3, 2, 2, 1, 1), (2, 2, 6, 7, 2, 2, 2, 2, 0, 0)]
for i, (N, C, H, W, R, S, sh, sw, ph, pw) in enumerate(pool_cases):
    p = "maxpool.%d." % i
    x = rnd(N, C, H, W)
    y, idx = F.max_pool2d(x, (R, S), (sh, sw), (ph, pw), return_indices=True)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", [N, C, H, W, R, S, sh, sw, ph, pw])
    put(p + "x", x); put(p + "out", y); put(p + "idx", idx)
    put(p + "dout", dy); put(p + "dx", x.grad)

# ---- global average pool ----
x = rnd(2, 5, 4, 3)
y = x.mean(dim=(2, 3))
dy = torch.randn_like(y)
y.backward(dy)
put("avgpool.cfg", [2, 5, 12])
put("avgpool.x", x); put("avgpool.out", y); put("avgpool.dout", dy); put("avgpool.dx", x.grad)

# ---- linear: N, C, K ----
N, C, K = 5, 7, 3
x, w, b = rnd(N, C), rnd(K, C, scale=0.5), rnd(K)
y = F.linear(x, w, b)
dy = torch.randn_like(y)
y.backward(dy)
put("linear.cfg", [N, C, K])
put("linear.x", x); put("linear.w", w); put("linear.b", b); put("linear.out", y)
put("linear.dout", dy); put("linear.dx", x.grad); put("linear.dw", w.grad); put("linear.db", b.grad)

# ---- softmax cross-entropy: N, K (mean over N) ----
N, K = 6, 5
x = rnd(N, K, scale=3.0)
with torch.no_grad():
    x[0, 1] += 40.0  # large logit: exercises the stable path
lab = torch.randint(0, K, (N,))
loss = F.cross_entropy(x, lab)
dloss = torch.tensor(0.7)
loss.backward(dloss)
put("xent.cfg", [N, K])
put("xent.x", x); put("xent.labels", lab); put("xent.loss", loss)
put("xent.probs", F.softmax(x.detach(), dim=1)); put("xent.dloss", dloss); put("xent.dx", x.grad)


# ---- temporal shift: TSM's official ops/temporal_shift.py shift() ----
def tsm_shift(x, n_segment, fold_div):
    nt, c, h, w = x.size()
    n_batch = nt // n_segment
    x = x.view(n_batch, n_segment, c, h, w)
    fold = c // fold_div
    out = torch.zeros_like(x)
    out[:, :-1, :fold] = x[:, 1:, :fold]  # shift left
    out[:, 1:, fold: 2 * fold] = x[:, :-1, fold: 2 * fold]  # shift right
    out[:, :, 2 * fold:] = x[:, :, 2 * fold:]  # not shift
    return out.view(nt, c, h, w)


for i, (B, T, C, H, W, fd) in enumerate([(2, 4, 16, 3, 3, 8), (1, 8, 8, 2, 3, 4),
                                          (2, 3, 12, 2, 2, 8)]):
    p = "tshift.%d." % i
    x = rnd(B * T, C, H, W)
    y = tsm_shift(x, T, fd)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(p + "cfg", [B, T, C, H * W, fd])
    put(p + "x", x); put(p + "out", y); put(p + "dout", dy); put(p + "dx", x.grad)

# ---- segment consensus (TSN 'avg'): B, T, K ----
B, T, K = 3, 4, 5
x = rnd(B * T, K)
y = x.view(B, T, K).mean(dim=1)
dy = torch.randn_like(y)
y.backward(dy)
put("consensus.cfg", [B, T, K])
put("consensus.x", x); put("consensus.out", y); put("consensus.dout", dy); put("consensus.dx", x.grad)

write(OUT)
