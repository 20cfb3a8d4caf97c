"""The PSGOLD1 record file the goldens use (read by tests/lib/golden_io.h),
shared by gen_layers.py, gen_layers3d.py and gen_det_masks.py.

Format (little-endian): magic b"PSGOLD1\\n", then records until EOF:
    u32 name_len, name (utf-8), u32 dtype (0 = f32, 1 = i32), u32 ndim,
    u32 dims[ndim], data (prod(dims) elements).
"""
import os
import struct
import sys

import numpy as np

records = []


def put(name, t):
    """Queue a tensor (or a list of ints) as one record of the module's list."""
    a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
    if a.dtype in (np.int64, np.int32):
        a, code = a.astype("<i4"), 1
    else:
        a, code = a.astype("<f4"), 0
    if a.ndim == 0:
        a = a.reshape(1)
    records.append((name, code, a))


def rnd(*shape, scale=1.0):
    import torch
    return (torch.randn(*shape) * scale).requires_grad_(True)


def write(path, recs=None):
    """Write recs, (name, code, array) with code 0 (f32) or 1 (i32), or the
    records queued with put()."""
    recs = records if recs is None else recs
    with open(path, "wb") as f:
        f.write(b"PSGOLD1\n")
        for name, code, a in recs:
            a = np.ascontiguousarray(a.astype("<i4" if code else "<f4"))
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", code, a.ndim))
            f.write(struct.pack("<%dI" % a.ndim, *a.shape))
            f.write(a.tobytes())
    print("wrote %s: %d records, %d bytes" % (path, len(recs), os.path.getsize(path)),
          file=sys.stderr)


class Golden:
    """Records collected by put() (float tensors as f32, integer / bool ones
    as i32, 0-dim as (1,)), then write(path): the two-stage detectors'
    generators (gen_roi_align.py)."""

    def __init__(self):
        self.records = []

    def put(self, name, t):
        a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        code = 1 if a.dtype.kind in "biu" else 0
        assert 0 < len(name) < 64, name
        self.records.append((name, code, np.atleast_1d(a)))

    def write(self, path):
        write(path, self.records)
        return len(self.records)
