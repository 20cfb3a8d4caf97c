#!/usr/bin/python3
"""Convert a PyTorch ResNet checkpoint to the safetensors file that
ps_model_load() reads (torchvision names, F32 weights, I64 counts).

    /usr/bin/python3 worker/models/torch2safetensors.py IN.pth OUT.safetensors

IN may be a torchvision state dict (torch.save(model.state_dict()), e.g. an
ImageNet-pretrained resnet50 whose 1000-class fc ps_model_load replaces
with PS_MODEL_LOAD_REPLACE_FC), a whole pickled model, or a TSM checkpoint
({"state_dict": ...} with "module.base_model." prefixes, TemporalShift's
".net." level and "new_fc"): those names are mapped back to torchvision's.
Needs torch; does not need the `safetensors` package (the format is
written by hand: 8-byte little-endian header length, JSON, data).
"""
import json
import re
import struct
import sys


def torchvision_name(k):
    k = re.sub(r"^module\.", "", k)
    k = re.sub(r"^base_model\.", "", k)
    k = k.replace(".net.", ".")          # TSM's TemporalShift wrapper
    k = re.sub(r"^new_fc\.", "fc.", k)   # TSM's replaced classifier
    return k


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    import torch
    obj = torch.load(sys.argv[1], map_location="cpu")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    tensors = {}
    for k, v in obj.items():
        if not torch.is_tensor(v):
            continue
        name = torchvision_name(k)
        if name in tensors:
            sys.exit("torch2safetensors: two tensors map to %s" % name)
        if v.is_floating_point():
            v = v.float()
            dt = "F32"
        elif v.dtype == torch.int64:
            dt = "I64"
        else:
            sys.exit("torch2safetensors: %s has dtype %s" % (k, v.dtype))
        tensors[name] = (dt, list(v.shape), v.contiguous().numpy().astype(
            "<f4" if dt == "F32" else "<i8").tobytes())
    header, off = {}, 0
    for name in sorted(tensors):
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in sorted(tensors):
            f.write(tensors[name][2])
    print("%s: %d tensors, %.1f MB" % (sys.argv[2], len(tensors), off / 1e6))


if __name__ == "__main__":
    main()
