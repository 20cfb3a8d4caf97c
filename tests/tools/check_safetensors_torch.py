#!/usr/bin/python3
"""Interop check: a safetensors file written by our C writer must read back in
torch with the expected values.  Run by tests/test_safetensors (with the
PS_PYTHON interpreter), or by hand:

    tests/test_safetensors --write-interop /tmp/x.safetensors
    /usr/bin/python3 tests/tools/check_safetensors_torch.py /tmp/x.safetensors

The parse here is independent of the C reader: struct + json + torch.frombuffer.
If the `safetensors` package is installed it is used as well.
Exit 0 = pass, 1 = fail, 77 = torch/numpy not available (skip)."""
import json
import struct
import sys

try:
    import numpy as np
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means skip
    print("skip: torch/numpy not importable: %s" % e)
    sys.exit(77)

DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
      "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
      "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}

# Must match interop_writer() in tests/test_safetensors.c.
EXPECT = {
    "a.f32": torch.arange(6, dtype=torch.float32).mul(0.25).sub(1).reshape(2, 3),
    "b.f16": torch.tensor([-1, -0.5, 0, 0.5, 1], dtype=torch.float16),
    "c.bf16": torch.tensor([1.5, 3, 4.5, 6], dtype=torch.bfloat16),
    "d.f64": (torch.arange(4, dtype=torch.float64) / 3.0).reshape(2, 2),
    "e.i64": torch.tensor(-42, dtype=torch.int64),
    "f.i32": torch.tensor([-7, 993, 1993], dtype=torch.int32),
    "g.i16": torch.tensor([-300, 300], dtype=torch.int16),
    "h.i8": torch.tensor([0, -1, -2], dtype=torch.int8),
    "i.u8": torch.tensor([250, 251, 252, 253], dtype=torch.uint8),
    "j.bool": torch.tensor([False, True, False]),
    "k.empty": torch.zeros(0),
}
META = {"format": "pt", "producer": "psd test \"q\" \u00fc"}


def load(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    assert n % 8 == 0, "header length %d not padded to 8" % n
    assert 8 + n <= len(buf), "header length past end"
    hdr = json.loads(buf[8:8 + n].decode("utf-8"))
    data = buf[8 + n:]
    meta = hdr.pop("__metadata__", {})
    out, end = {}, 0
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, en = e["data_offsets"]
        assert b == end, "%s: offset %d, expected %d (gap/overlap)" % (name, b, end)
        dt = DT[e["dtype"]]
        numel = int(np.prod(e["shape"], dtype=np.int64))
        assert en - b == numel * torch.tensor([], dtype=dt).element_size(), name
        raw = bytearray(data[b:en])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
        end = en
    assert end == len(data), "data section has %d bytes, tensors cover %d" % (len(data), end)
    return out, meta


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    path = sys.argv[1]
    got, meta = load(path)
    bad = 0
    if set(got) != set(EXPECT):
        print("tensor names differ: %s" % sorted(set(got) ^ set(EXPECT)))
        bad += 1
    for name, want in EXPECT.items():
        t = got.get(name)
        if t is None:
            continue
        if t.dtype != want.dtype or tuple(t.shape) != tuple(want.shape) or not torch.equal(t, want):
            print("%s: got %s %s %s, want %s %s %s" % (name, t.dtype, tuple(t.shape), t.tolist(),
                                                      want.dtype, tuple(want.shape), want.tolist()))
            bad += 1
    if meta != META:
        print("metadata: got %r want %r" % (meta, META))
        bad += 1
    try:  # the reference reader, when present
        from safetensors.torch import load_file
        ref = load_file(path)
        for name, want in EXPECT.items():
            if not torch.equal(ref[name], want):
                print("safetensors.torch: %s differs" % name)
                bad += 1
        print("checked with safetensors.torch too")
    except ImportError:
        pass
    print("%s: %d tensors, %s" % (path, len(got), "OK" if not bad else "%d FAILURES" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
