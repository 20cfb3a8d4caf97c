#!/usr/bin/python3
"""Golden fp32 -> fp16 / bf16 conversions from PyTorch for tests/test_half.c.

Run once with Debian's /usr/bin/python3 (python3-torch); writes
tests/golden/half_cases.bin:  u32 count | count x f32 | count x u16 fp16 |
count x u16 bf16 (little-endian).  NaN inputs are left out: PyTorch
canonicalises NaN payloads, the test checks NaN separately."""
import os
import struct

import numpy as np
import torch

rng = np.random.default_rng(20261129)
vals = []
# edges around every fp16 / bf16 exponent, ties, subnormals, overflow
for e in range(-30, 20):
    base = 2.0 ** e
    for m in (1.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,
              1.0 + 2 ** -23, 2.0 - 2 ** -23, 1.5, 1.0 + 2 ** -11 + 2 ** -23):
        vals += [base * m, -base * m]
vals += [0.0, -0.0, 65504.0, 65519.0, 65520.0, 65536.0, 1e38, 3.4028234663852886e38,
         float("inf"), float("-inf"), 2 ** -24, 2 ** -25, 3 * 2 ** -25, 2 ** -25 * 1.0000001]
vals += list(rng.standard_normal(2000) * 1e-3)
vals += list(rng.standard_normal(1000) * 100)
bits = rng.integers(0, 2 ** 32, 1500, dtype=np.uint64).astype(np.uint32)
f = bits.view(np.float32)
vals += [float(x) for x in f[~np.isnan(f)]]
x = torch.tensor(np.array(vals, dtype=np.float32))
h = x.half().view(torch.int16).numpy().astype(np.uint16)
b = x.bfloat16().view(torch.int16).numpy().astype(np.uint16)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "half_cases.bin")
with open(out, "wb") as fp:
    fp.write(struct.pack("<I", len(x)))
    fp.write(x.numpy().astype("<f4").tobytes())
    fp.write(h.astype("<u2").tobytes())
    fp.write(b.astype("<u2").tobytes())
print(out, len(x))
