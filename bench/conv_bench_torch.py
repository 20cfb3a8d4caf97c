#!/usr/bin/python3
"""PyTorch (Debian python3-torch, oneDNN) on the shapes of bench/conv_bench.c,
same batch and threads, best of reps, same columns - run the two back to back
on an idle machine to compare:  conv_bench_torch.py [threads] [reps] [images]"""
import sys
import time

import torch
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
N = int(sys.argv[3]) if len(sys.argv) > 3 else 16
torch.set_num_threads(threads)
shapes = [  # name, C, K, R, stride, H  (pad R//2) - keep in step with conv_bench.c
    ("stem 7x7/2 3->64 @112", 3, 64, 7, 2, 112),
    ("l1 1x1 64->64 @28", 64, 64, 1, 1, 28),
    ("l1 3x3 64->64 @28", 64, 64, 3, 1, 28),
    ("l1 1x1 64->256 @28", 64, 256, 1, 1, 28),
    ("l1 1x1 256->64 @28", 256, 64, 1, 1, 28),
    ("l2 3x3/2 128 @28", 128, 128, 3, 2, 28),
    ("l2 ds 1x1/2 256->512 @28", 256, 512, 1, 2, 28),
    ("l2 3x3 128 @14", 128, 128, 3, 1, 14),
    ("l2 1x1 512->128 @14", 512, 128, 1, 1, 14),
    ("l3 3x3 256 @7", 256, 256, 3, 1, 7),
    ("l3 1x1 1024->256 @7", 1024, 256, 1, 1, 7),
    ("l4 3x3 512 @4", 512, 512, 3, 1, 4),
    ("l4 1x1 512->2048 @4", 512, 2048, 1, 1, 4),
]
print("torch %s, %d threads, %d images, %d reps" % (torch.__version__, threads, N, reps))
print("%-28s %8s %8s %9s %9s" % ("layer", "fwd ms", "bwd ms", "fwd GF/s", "bwd GF/s"))
tf_all = tb_all = fl_all = 0.0
for i, (name, C, K, R, s, H) in enumerate(shapes):
    x = torch.randn(N, C, H, H, requires_grad=(i != 0))
    w = torch.randn(K, C, R, R, requires_grad=True)
    y = F.conv2d(x, w, None, s, R // 2)
    dy = torch.randn_like(y)
    tf = tb = 1e30
    for r in range(reps + 1):
        t0 = time.perf_counter()
        y = F.conv2d(x, w, None, s, R // 2)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        if r:  # the first run warms up
            tf, tb = min(tf, t1 - t0), min(tb, t2 - t1)
    fl = 2.0 * y.numel() * C * R * R
    flb = fl * (1 if i == 0 else 2)
    print("%-28s %8.2f %8.2f %9.1f %9.1f" % (name, tf * 1e3, tb * 1e3, fl / tf * 1e-9, flb / tb * 1e-9))
    tf_all, tb_all, fl_all = tf_all + tf, tb_all + tb, fl_all + fl + flb
print("\nall shapes once: fwd %.1f ms, bwd %.1f ms, %.1f GFLOP/s" %
      (tf_all * 1e3, tb_all * 1e3, fl_all / (tf_all + tb_all) * 1e-9))
