#!/usr/bin/python3
"""Golden frame indices for tests/test_video_dense.c: dense clip sampling as
mmaction2's SampleFrames (clip_len T, frame_interval stride, num_clips n,
out_of_bound_opt 'loop', start_index 1) computes it, written here with
numpy from that rule, not from the C code.

Training offsets are random: mmaction2 draws them with numpy; the engine
draws below(N - L + 1) from its documented stream (worker/data/ps_video.h),
which is implemented again here so both sides draw the same offset.

Run once with /usr/bin/python3 (numpy), from the source root:
    /usr/bin/python3 tests/golden/gen_video_dense.py
Lines: "test N T stride clip nclips idx..." and
       "train N T stride seed epoch index idx...".
"""
import os

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z):
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Stream:
    def __init__(self, seed, epoch, index):
        self.s = mix(mix(mix(seed) ^ epoch) ^ index)

    def below(self, n):
        out = mix(self.s)
        self.s = (self.s + GOLDEN) & M64
        return (out * n) >> 64


def test_clips(N, T, stride, n):
    """mmaction2 SampleFrames._get_test_clips, then the loop and start_index."""
    L = T * stride
    a = (N - L + 1) / float(n)
    if N > L - 1:
        offs = (np.arange(n) * a + a / 2.0).astype(np.int32)
    else:
        offs = np.zeros((n,), dtype=np.int32)
    inds = offs[:, None] + np.arange(T)[None, :] * stride
    return np.mod(inds, N) + 1


def train_clip(N, T, stride, stream):
    """_get_train_clips with num_clips 1: randint(N - L + 1) when positive."""
    L = T * stride
    room = N - L + 1
    off = stream.below(room) if room > 0 else 0
    return np.mod(off + np.arange(T) * stride, N) + 1


def main():
    lines = []
    for N, T, stride, n in [(16, 8, 2, 1), (16, 8, 2, 3), (40, 8, 2, 2), (10, 8, 2, 1),
                            (64, 32, 2, 1), (5, 4, 3, 2), (33, 16, 1, 4), (16, 8, 1, 1)]:
        for c, row in enumerate(test_clips(N, T, stride, n)):
            lines.append("test %d %d %d %d %d %s" % (N, T, stride, c, n, " ".join(map(str, row))))
    for N, T, stride, seed, epoch, index in [(16, 8, 2, 7, 0, 3), (40, 8, 2, 7, 1, 5),
                                             (100, 32, 2, 1, 0, 0), (10, 8, 2, 7, 0, 1),
                                             (16, 8, 1, 99, 3, 12), (17, 4, 4, 5, 2, 8)]:
        row = train_clip(N, T, stride, Stream(seed, epoch, index))
        lines.append("train %d %d %d %d %d %d %s" % (N, T, stride, seed, epoch, index,
                                                     " ".join(map(str, row))))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "video_dense.txt")
    with open(out, "w") as f:
        f.write("# dense sampling indices (gen_video_dense.py): mmaction2 SampleFrames, loop, 1-based\n")
        f.write("\n".join(lines) + "\n")
    print("wrote %s: %d lines" % (out, len(lines)))


if __name__ == "__main__":
    main()
