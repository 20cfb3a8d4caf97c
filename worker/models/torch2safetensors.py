#!/usr/bin/python3
"""Convert a PyTorch checkpoint to the safetensors file that psworker's
--weights reads (ps_model_load / ps_retina_load_weights, worker/models/
ps_weights.h).

    /usr/bin/python3 worker/models/torch2safetensors.py IN.pth OUT.safetensors \\
        [--shift-div N] [--segments T]

IN may be a torchvision state dict (torch.save(model.state_dict()), e.g. an
ImageNet-pretrained resnet50 whose 1000-class fc psworker re-initialises for
another class count, or the backbone of a detector), a whole pickled model,
or a checkpoint of the official TSM repository ({"state_dict": ...} with the
"module.base_model." prefixes, TemporalShift's ".net." level and "new_fc").
Tensor names are kept as they are: psworker maps TSM's names to ours and
reads the shift placement (blockres / block) from where the ".net." levels
sit.  What the names cannot say -- TSM's shift_div and segment count -- TSM
keeps in the checkpoint's file name (TSM_kinetics_RGB_resnet50_shift8_
blockres_avg_segment8_e50.pth, parsed as TSM's test_models.py does) and this
script records in the file's metadata (tsm.shift_div, tsm.shift_place,
tsm.n_segment, tsm.arch), which psworker uses when --shift-div is not given;
--shift-div / --segments set them for a file named otherwise.

Needs torch; does not need the `safetensors` package (the format is written
by hand: 8-byte little-endian header length, JSON, data).
"""
import argparse
import json
import os
import re
import struct
import sys


def tsm_options(path):
    """TSM's options from its checkpoint file name (test_models.py's
    parse_shift_option_from_log_name, plus the segment count and arch)."""
    name = os.path.basename(path)
    meta = {}
    m = re.search(r"_shift(\d+)_([a-z_]+?)_(avg|max|identity)", name)
    if m:
        meta["tsm.shift_div"] = m.group(1)
        meta["tsm.shift_place"] = m.group(2)
    m = re.search(r"_segment(\d+)", name)
    if m:
        meta["tsm.n_segment"] = m.group(1)
    m = re.match(r"TSM_[^_]+_[^_]+_([a-z0-9]+)_", name)
    if m:
        meta["tsm.arch"] = m.group(1)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--shift-div", type=int, help="TSM's shift_div (else from the file name)")
    ap.add_argument("--segments", type=int, help="TSM's segment count (else from the file name)")
    a = ap.parse_args()
    import torch
    obj = torch.load(a.input, map_location="cpu")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        sys.exit("torch2safetensors: %s holds no state dict (a %s)" % (a.input, type(obj).__name__))
    tensors = {}
    for k, v in obj.items():
        if not torch.is_tensor(v):
            continue
        if v.is_floating_point():
            v = v.float()
            dt = "F32"
        elif v.dtype == torch.int64:
            dt = "I64"
        else:
            sys.exit("torch2safetensors: %s has dtype %s" % (k, v.dtype))
        tensors[k] = (dt, list(v.shape), v.contiguous().numpy().astype(
            "<f4" if dt == "F32" else "<i8").tobytes())
    meta = {"format": "pt"}
    if any(k.startswith(("module.base_model.", "base_model.")) for k in tensors):
        meta.update(tsm_options(a.input))
    if a.shift_div:
        meta["tsm.shift_div"] = str(a.shift_div)
    if a.segments:
        meta["tsm.n_segment"] = str(a.segments)
    header, off = {"__metadata__": meta}, 0
    for name in sorted(tensors):
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = a.output + ".tmp.%d" % os.getpid()
    with open(tmp, "wb") as f:  # then renamed: no half-written output
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in sorted(tensors):
            f.write(tensors[name][2])
    os.replace(tmp, a.output)
    extra = " ".join("%s=%s" % kv for kv in sorted(meta.items()) if kv[0] != "format")
    print("%s: %d tensors, %.1f MB%s" % (a.output, len(tensors), off / 1e6,
                                          (" (" + extra + ")") if extra else ""))


if __name__ == "__main__":
    main()
