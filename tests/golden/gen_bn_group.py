#!/usr/bin/python3
"""Golden tensors for tests/test_bn_group.c (cross-worker BN, --bn sync):
PyTorch's SyncBatchNorm math on W ranks, computed in float64 on the CPU.

SyncBatchNorm normalises every rank's batch with the statistics of the
union of the ranks' batches (mean, biased variance), updates the running
statistics with the union's mean and unbiased variance, and in the backward
uses the union's sums of dy and dy*xhat for the input gradient, while each
rank's weight / bias gradient is its own sum (DDP then averages them).
That is exactly batch_norm over the concatenated batch, with each rank's
parameter gradient taken from its own slice's loss alone, which is what is
computed here (torch.nn.SyncBatchNorm itself needs CUDA and a process
group; the math is the same).

Run once with Debian's interpreter (python3-torch), from the source root:
    /usr/bin/python3 tests/golden/gen_bn_group.py
and commit tests/golden/bn_group_golden.bin.  The test never needs torch.

Records per case "<case>": cfg (W, C, HW, eps*1e6, momentum*1e6, N_0..N_W-1),
gamma, beta, rm0, rv0 (running statistics before), rm1, rv1 (after), mean,
rstd (the union's, as saved for the backward), and per rank r: x<r>, dout<r>
(its upstream gradient), y<r>, dx<r>, dgamma<r>, dbeta<r>.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from psgold import put, write  # noqa: E402

torch.manual_seed(20261203)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bn_group_golden.bin")

# name, batch per rank, C, H, W, offset of the data (a large mean makes the
# variance a small difference of large sums: the case that needs care)
CASES = [
    ("even", [2, 2], 5, 7, 3, 0.0),
    ("uneven", [1, 3, 2], 4, 5, 1, 0.0),
    ("offset", [2, 1, 2, 3], 3, 4, 4, 50.0),
]
EPS, MOM = 1e-5, 0.1

for name, ns, C, H, W, off in CASES:
    HW = H * W
    xs = [(torch.randn(n, C, H, W, dtype=torch.float64) * (0.5 + torch.rand(1, C, 1, 1)) + off
           + torch.randn(1, C, 1, 1)).float().double() for n in ns]
    douts = [torch.randn(n, C, H, W, dtype=torch.float64).float().double() for n in ns]
    gamma = (0.5 + torch.rand(C, dtype=torch.float64)).float().double().requires_grad_(True)
    beta = (torch.randn(C, dtype=torch.float64) * 0.3).float().double().requires_grad_(True)
    rm0 = (torch.randn(C, dtype=torch.float64) * 0.2).float().double()
    rv0 = (0.5 + torch.rand(C, dtype=torch.float64)).float().double()
    rm, rv = rm0.clone(), rv0.clone()
    x = torch.cat(xs).requires_grad_(True)
    y = F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=MOM, eps=EPS)
    xa = x.detach()
    mean = xa.mean(dim=(0, 2, 3))
    var = xa.var(dim=(0, 2, 3), unbiased=False)
    put(name + ".cfg", [len(ns), C, HW, int(EPS * 1e6), int(MOM * 1e6)] + ns)
    put(name + ".gamma", gamma)
    put(name + ".beta", beta)
    put(name + ".rm0", rm0)
    put(name + ".rv0", rv0)
    put(name + ".rm1", rm)
    put(name + ".rv1", rv)
    put(name + ".mean", mean)
    put(name + ".rstd", 1.0 / torch.sqrt(var + EPS))
    # the input gradient: of the sum over the ranks of each rank's loss
    ys = torch.split(y, ns)
    total = sum((yr * dr).sum() for yr, dr in zip(ys, douts))
    (dx,) = torch.autograd.grad(total, x, retain_graph=True)
    dxs = torch.split(dx, ns)
    for r, (xr, dr, yr, dxr) in enumerate(zip(xs, douts, ys, dxs)):
        # the parameter gradients: of this rank's own loss
        dg, db = torch.autograd.grad((yr * dr).sum(), (gamma, beta), retain_graph=True)
        put("%s.x%d" % (name, r), xr)
        put("%s.dout%d" % (name, r), dr)
        put("%s.y%d" % (name, r), yr)
        put("%s.dx%d" % (name, r), dxr)
        put("%s.dgamma%d" % (name, r), dg)
        put("%s.dbeta%d" % (name, r), db)

write(OUT)
