"""Writer of PSGOLD1 golden files (tests/lib/golden_io.h reads them): magic
b"PSGOLD1\\n", then records: u32 name length, name, u32 dtype (0 f32, 1 i32),
u32 ndim, u32 dims, data (little-endian).  Used by the two-stage detector
generators (gen_roi_align.py, gen_rcnn_parts.py)."""
import struct

import numpy as np
import torch


class Golden:
    def __init__(self):
        self.records = []

    def put(self, name, t):
        """float tensors as f32, integer / bool ones as i32; 0-dim as (1,)"""
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        code = 1 if a.dtype.kind in "biu" else 0
        a = np.atleast_1d(a.astype("<i4" if code else "<f4"))
        assert 0 < len(name) < 64, name
        self.records.append((name, code, a))

    def write(self, path):
        with open(path, "wb") as f:
            f.write(b"PSGOLD1\n")
            for name, code, a in self.records:
                head = [len(name)]
                f.write(struct.pack("<I", *head) + name.encode())
                f.write(struct.pack("<%dI" % (2 + a.ndim), code, a.ndim, *a.shape))
                f.write(a.tobytes())
        return len(self.records)
