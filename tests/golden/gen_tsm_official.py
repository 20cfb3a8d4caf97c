#!/usr/bin/python3
"""Checkpoints in the official TSM repository's layout, for the import of
such checkpoints (worker/models/ps_weights.h, docs/video.md).

The module tree is TSM's ops/models.py TSN wrapper as its state dict shows
it, written here from the repository's documented structure (not copied):

    TSN
      base_model        a torchvision ResNet; its fc replaced by Dropout
                        when dropout > 0, else a Linear to the classes
      new_fc            Linear(features, classes), only when dropout > 0
    forward: base_model on the B*T frames, new_fc, view (B, T, K), mean
    over T ("avg" consensus)

with make_temporal_shift(base_model, T, n_div, place): 'blockres' wraps
conv1 of every block (every second when layer3 has >= 23 blocks) in
TemporalShift(net=conv1), 'block' wraps every whole block; TemporalShift
keeps the wrapped module as .net, so the names gain a ".net." level.  The
repository's main.py saves {"epoch", "arch", "state_dict": DataParallel
(TSN).state_dict(), "best_prec1"}: every name starts "module.".

Run once with Debian's interpreter to write the committed golden:
    /usr/bin/python3 tests/golden/gen_tsm_official.py tests/golden
-> tsm_official_r18w8.safetensors: a width-8 TSM-ResNet-18, place 'block',
   shift_div 4, 5 classes, dropout 0 (base_model.fc), saved without
   DataParallel (names "base_model.*"), torch's own init and BN statistics
   from 2 training batches, converted as worker/models/torch2safetensors.py
   does (names kept, tsm.* metadata);
-> tsm_official_r18w8.txt: its eval logits (T 4, 1 clip, 32x32) for the
   hash input of gen_resnet.py (seed 1234), which tests/test_weights.c
   compares with the engine's.
Also a module for tests/tools/check_tsm_import.py (the live check).
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_resnet as G  # noqa: E402

SEED = 1234


def make_temporal_shift(net, n_segment, n_div, place):
    """TSM's make_temporal_shift for a ResNet, places 'blockres' and 'block'."""
    n_round = 2 if place == "blockres" and len(list(net.layer3.children())) >= 23 else 1
    for s in range(1, 5):
        stage = getattr(net, "layer%d" % s)
        blocks = list(stage.children())
        for i, b in enumerate(blocks):
            if place == "block":
                blocks[i] = G.TemporalShift(b, n_segment, n_div)
            elif i % n_round == 0:
                b.conv1 = G.TemporalShift(b.conv1, n_segment, n_div)
        setattr(net, "layer%d" % s, nn.Sequential(*blocks))


class TSN(nn.Module):
    """The official TSN wrapper's layout (base_model, new_fc) and forward."""

    def __init__(self, num_class, num_segments, depth=18, width=8, dropout=0.5, is_shift=True,
                 shift_div=8, shift_place="blockres"):
        super().__init__()
        self.num_segments, self.num_class = num_segments, num_class
        self.base_model = G.ResNetReplica(depth, 1000, width)
        feature_dim = self.base_model.fc.in_features
        if dropout > 0:
            self.base_model.fc = nn.Dropout(p=dropout)
            self.new_fc = nn.Linear(feature_dim, num_class)
        else:
            self.base_model.fc = nn.Linear(feature_dim, num_class)
            self.new_fc = None
        if is_shift:
            make_temporal_shift(self.base_model, num_segments, shift_div, shift_place)

    def forward(self, x):
        """x: (B*T, 3, H, W) frames, clip-major; returns (B, K)."""
        out = self.base_model(x)
        if self.new_fc is not None:
            out = self.new_fc(out)
        return out.view(-1, self.num_segments, self.num_class).mean(1)


def build(K, T, place, div, dropout, width=8, depth=18, seed=3, H=32):
    """A TSN with torch's init and BN statistics from 2 training batches."""
    torch.manual_seed(seed)
    net = TSN(K, T, depth, width, dropout, True, div, place)
    net.train()
    with torch.no_grad():
        for _ in range(2):
            net(torch.randn(2 * T, 3, H, H))
    net.eval()
    return net


def checkpoint(net, data_parallel):
    """The state dict as the repository's main.py saves it."""
    sd = net.state_dict()
    if data_parallel:
        sd = {"module." + k: v for k, v in sd.items()}
    return {"epoch": 1, "arch": "resnet18", "state_dict": sd, "best_prec1": 0.0}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    T, K, H = 4, 5, 32
    net = build(K, T, "block", 4, 0.0)
    x = G.hash_input(1, T, H, H, SEED)
    with torch.no_grad():
        logits = net(x)[0]
    sd = {k: v.detach().numpy() for k, v in checkpoint(net, False)["state_dict"].items()}
    meta = {"format": "pt", "tsm.shift_div": "4", "tsm.shift_place": "block",
            "tsm.n_segment": str(T), "tsm.arch": "resnet18"}
    G.write_safetensors(os.path.join(out, "tsm_official_r18w8.safetensors"), sd, meta)
    with open(os.path.join(out, "tsm_official_r18w8.txt"), "w") as f:
        f.write("# TSM official layout: resnet18 width 8, place block, shift_div 4, K %d, T %d, "
                "%dx%d, dropout 0 (base_model.fc), eval logits for hash_input(1, %d, %d, %d, %d)\n"
                % (K, T, H, H, T, H, H, SEED))
        f.write("logits %d %s\n" % (K, " ".join("%.9g" % v for v in logits.tolist())))
    print("tsm_official_r18w8: %d tensors, logits %s" % (len(sd), logits.tolist()))


if __name__ == "__main__":
    main()
