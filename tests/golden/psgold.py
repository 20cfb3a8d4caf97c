"""The PSGOLD1 golden format that tests/lib/golden_io.h reads (little-endian):
magic b"PSGOLD1\\n", then records: u32 name_len, name, u32 dtype (0 = f32,
1 = i32), u32 ndim, u32 dims[ndim], data."""
import struct

import numpy as np


def write(path, records):
    """records: (name, code, array) with code 0 (f32) or 1 (i32)."""
    with open(path, "wb") as f:
        f.write(b"PSGOLD1\n")
        for name, code, a in records:
            a = np.ascontiguousarray(a.astype("<i4" if code else "<f4"))
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", code, a.ndim))
            f.write(struct.pack("<%dI" % a.ndim, *a.shape))
            f.write(a.tobytes())


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
