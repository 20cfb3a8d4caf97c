#!/usr/bin/python3
"""Write the small seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/).

Standard library only.  The seeds are valid inputs (so a fuzzer starts past
the first checks) plus a few near-misses; tests/test_fuzz_replay.c replays
them and mutations of them in every `make check`.  Run from anywhere:
    /usr/bin/python3 tests/fuzz/gen_corpus.py
Formats follow common/ps_codec.h, proto/ps.proto, the safetensors spec and
common/ps_config.h; the harness input layouts are described in each
tests/fuzz/fuzz_*.c.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def f16(x):
    return struct.pack("<e", x)


# ---- codec: u8 dtype | u8 codec | u8 mode | u16 numel | u8 ratio | payload
def codec_in(dt, codec, mode, numel, ratio, payload):
    return struct.pack("<BBBHB", dt, codec, mode, numel, ratio) + payload


vals = [0.5, -1.25, 3.0, 0.0, -0.0, 1e-3, -7.5, 2.0]
raw32 = b"".join(struct.pack("<f", v) for v in vals)
put("codec", "raw_fp32", codec_in(0, 0, 0, 8, 0, raw32))
put("codec", "raw_fp16_add", codec_in(1, 0, 1, 8, 0, b"".join(f16(v) for v in vals)))
# LZ4 frame: "PSZ1" | dtype | flags(shuffle) | 0 | numel | chunks; one stored chunk
shuf = bytes(raw32[i * 4 + b] for b in range(4) for i in range(8))
lz_stored = struct.pack("<IBBHQ", 0x315A5350, 0, 1, 0, 8) + struct.pack("<I", 0x80000000 | 32) + shuf
put("codec", "lz4_stored_fp32", codec_in(0, 1, 0, 8, 0, lz_stored))
# one LZ4 block of literals only: token (len << 4), literals
lit = shuf
block = bytes([15 << 4, len(lit) - 15]) + lit
lz_block = struct.pack("<IBBHQ", 0x315A5350, 0, 1, 0, 8) + struct.pack("<I", len(block)) + block
put("codec", "lz4_block_fp32", codec_in(0, 1, 2, 8, 0, lz_block))
# TOPK: "PSK1" | dtype | 0 | 0 | numel | k | u32 idx[k] | values[k]
idx = [1, 2, 6]
topk = struct.pack("<IBBHQQ", 0x314B5350, 0, 0, 0, 8, 3) + b"".join(struct.pack("<I", i) for i in idx) \
    + b"".join(struct.pack("<f", vals[i]) for i in idx)
put("codec", "topk_fp32", codec_in(0, 2, 0, 8, 96, topk))
topk16 = struct.pack("<IBBHQQ", 0x314B5350, 1, 0, 0, 8, 3) + b"".join(struct.pack("<I", i) for i in idx) \
    + b"".join(f16(vals[i]) for i in idx)
put("codec", "topk_fp16_add", codec_in(1, 2, 1, 8, 255, topk16))
put("codec", "topk_unsorted", codec_in(0, 2, 0, 8, 0, topk[:24] + struct.pack("<III", 2, 1, 6) + topk[36:]))
# SIGN: "PSG1" | dtype | 0 | 0 | numel | f32 scale | bits
bits = sum(1 << i for i, v in enumerate(vals) if struct.unpack("<I", struct.pack("<f", v))[0] >> 31)
sign = struct.pack("<IBBHQf", 0x31475350, 2, 0, 0, 8, 2.0) + bytes([bits])
put("codec", "sign_bf16", codec_in(2, 3, 0, 8, 0, sign))
sign11 = struct.pack("<IBBHQf", 0x31475350, 0, 0, 0, 11, 0.75) + bytes([0xA5, 0x03])
put("codec", "sign_fp32_sub", codec_in(0, 3, 2, 11, 0, sign11))
put("codec", "sign_nan_scale", codec_in(2, 3, 0, 8, 0, sign[:16] + struct.pack("<I", 0x7FC00000) + sign[20:]))


# ---- wire: frames as u16 length + bytes; frame 0 = ps.Header (protobuf)
def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frames(*fs):
    return b"".join(struct.pack("<H", len(f)) + f for f in fs)


hello = field_varint(1, 1) + field_varint(2, 1) + field_bytes(18, b"host-0")
put("wire", "hello", frames(hello))
payload = raw32
push = (field_varint(1, 1) + field_varint(2, 4) + field_varint(3, 0) + field_varint(4, 3) + field_varint(5, 7)
        + field_varint(6, 0) + field_varint(7, 0) + field_varint(8, 8) + field_varint(9, len(payload))
        + field_varint(10, crc32c(payload)) + field_varint(11, 42) + field_varint(15, 0x1234567890ABCDEF))
put("wire", "push_crc", frames(push, payload))
put("wire", "push_bad_crc", frames(push, payload[:-1] + b"\x00"))
error = field_varint(1, 1) + field_varint(2, 12) + varint(12 << 3) + varint(2 * 5 + 1) + field_bytes(13, b"bad thing")
put("wire", "error", frames(error))
put("wire", "three_frames", frames(hello, b"x", b"y"))
put("wire", "bad_version", frames(field_varint(1, 2) + field_varint(2, 8)))
put("wire", "len_mismatch", frames(field_varint(1, 1) + field_varint(2, 4) + field_varint(9, 99), b"abc"))


# ---- safetensors: u64 header length | JSON | data
def st(tensors, meta=None, pad=0):
    hdr, data = {}, b""
    for name, dtype, shape, blob in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    if meta:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "two_f32", st([("layer1.0.conv1.weight", "F32", [2, 2], raw32[:16]),
                                  ("fc.bias", "F32", [4], raw32[16:])], {"format": "pt"}))
put("safetensors", "mixed_dtypes", st([("a", "F16", [3], f16(1.0) * 3), ("b", "BF16", [1], b"\x80\x3f"),
                                       ("c", "F64", [1], struct.pack("<d", 2.5)), ("d", "I64", [1], b"\0" * 8),
                                       ("e", "U8", [0], b"")], pad=3))
put("safetensors", "scalar_and_empty", st([("s", "F32", [], raw32[:4]), ("z", "F32", [0, 5], b"")]))
ov = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
put("safetensors", "overlap", struct.pack("<Q", len(ov)) + ov + b"\0" * 12)
put("safetensors", "short_header", struct.pack("<Q", 1000) + b"{}")

# ---- config: byte 0 even = INI file, odd = argv split at NUL
put("config", "ini_basic", b"\0" + b"# comment\nport = 7100\nlr = 0.5 ; trailing\n[psd]\nname = \"a # b\"\n"
    b"verbose = yes\npartition-bytes = 4MiB\n[psworker]\nunknown = 1\n")
put("config", "ini_errors", b"\0" + b"port = 99999999999\nlr = nan\n[psd\nbogus\n")
put("config", "argv_flags", b"\1" + b"\0".join([b"--port", b"7001", b"--lr=0.25", b"--no-verbose", b"pos1",
                                                 b"--partition_bytes", b"1G", b"--", b"--name"]))
put("config", "argv_help", b"\1" + b"\0".join([b"-h"]))
put("config", "argv_bad", b"\1" + b"\0".join([b"--port", b"12x", b"--verbose=maybe", b"--name"]))

# ---- video_list: byte 0 = options (bit 0 skip_bad, bit 1 check_frames,
# bits 2-3 min_frames - 1, bit 4: first line is the frame template)
put("video_list", "list_basic", b"\0vid/a 8 0\nvid/b 16 3\n# comment\n\nvid with space 10 1\n")
put("video_list", "list_skipbad", b"\1vid/a 8 0\nbad line\nvid/c -3 1\nvid/d 9 x\nvid/e\t12\t2\n")
put("video_list", "list_bad_fields", b"\0vid/a 8\n")
put("video_list", "list_tmpl", b"\x10frame_%06d.png\nvid/a 8 0\nvid/b 3 1\n")
put("video_list", "list_tmpl_evil", b"\x12%s%n\nvid/a 8 0\n")
put("video_list", "list_minframes_checkframes", b"\x0dvid/a 2 0\nvid/b 5 1\n/abs/path 7 4\n")
put("video_list", "list_ranges", b"\0vid/a 10000001 0\nvid/b 8 1000001\n")
put("video_list", "list_nul", b"\1\0\0vid 3 3\n")

# ---- coco: byte 0 = options (bit 0 lenient, bit 1 the rest is a results
# file read against the harness's fixed ground truth, else ground truth)
gt = {"images": [{"id": 1, "width": 12, "height": 9, "file_name": "a.jpg"},
                 {"id": 7, "width": 5, "height": 7}],
      "annotations": [
          {"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 4, 4], "area": 16,
           "segmentation": [[1, 1, 5, 1, 5, 5, 1, 5], [7, 2, 11, 2, 9, 8]]},
          {"id": 2, "image_id": 7, "category_id": 3, "bbox": [0, 0, 5, 7], "iscrowd": 1,
           "segmentation": {"size": [7, 5], "counts": [3, 10, 22]}},
          {"id": 3, "image_id": 7, "category_id": 4, "bbox": [1, 1, 2, 4],
           "segmentation": {"size": [7, 5], "counts": "8430="}},
          {"id": 4, "image_id": 1, "category_id": 4, "bbox": [2, 2, 3, 3]}],
      "categories": [{"id": 3, "name": "a"}, {"id": 4, "name": "b"}]}
put("coco", "gt_forms", b"\0" + json.dumps(gt).encode())
bad = json.loads(json.dumps(gt))
bad["annotations"][0]["segmentation"] = [[1, 1, 5, 1, 5], [1, 1]]
bad["annotations"][1]["segmentation"]["counts"] = [3, 10, 21]
bad["annotations"][2]["segmentation"]["counts"] = "8 1b~"
put("coco", "gt_bad_lenient", b"\1" + json.dumps(bad).encode())
put("coco", "results_masks", b"\2" + json.dumps([
    {"image_id": 1, "category_id": 1, "score": 0.9, "bbox": [1, 1, 4, 4],
     "segmentation": {"size": [9, 12], "counts": ":4500000n1"}},
    {"image_id": 2, "category_id": 2, "score": 0.4,
     "segmentation": {"size": [7, 5], "counts": [0, 35]}},
    {"image_id": 2, "category_id": 1, "score": 0.3,
     "segmentation": {"size": [9, 12], "counts": [108]}}]).encode())
put("coco", "gt_edges_empty", b"\0" + json.dumps({
    "images": [{"id": 1, "width": 4, "height": 3}, {"id": 2, "width": 60000, "height": 60000}],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 3],
         "segmentation": [[-0.5, -0.5, 4.5, -0.5, 4.5, 3.5, -0.5, 3.5]]},
        {"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 60000, 60000],
         "segmentation": [[0, 0, 60000, 0, 0, 60000]]},
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [1, 1, 0, 2],
         "segmentation": [[1, 1, 1, 3, 1, 2]]}],
    "categories": [{"id": 1}]}).encode())
put("coco", "results_bad_lenient", b"\3" + json.dumps([
    {"image_id": 1, "category_id": 1, "score": 0.9, "segmentation": [[1, 1, 5, 1, 5, 5]]},
    {"image_id": 2, "category_id": 2, "score": 0.4, "segmentation": {"size": [9, 12], "counts": [108]}},
    {"image_id": 2, "category_id": 2, "score": 0.4, "segmentation": {"size": [7, 5], "counts": "0@"}},
    {"image_id": 1, "category_id": 2, "score": 0.2, "bbox": [0, 0, 3, 3],
     "segmentation": {"size": [9, 12], "counts": [10, 5, 93]}}]).encode())
