"""PyTorch's TSM-ResNet-50 training step on the GPU, for bench/gpu_check.sh.

torchvision ResNet-50 with TSM's residual shift (1/8 of the channels one
frame each way on the input of every bottleneck's conv1, identity path
unshifted), dropout 0.5 -> fc (400) per frame -> mean over the segments ->
cross-entropy.  Times forward + backward (no optimizer step: ours has none,
the update runs on the parameter server) in two set-ups:
  fp32: NCHW, TF32 off (what our fp32 backend computes),
  amp:  autocast fp16 + GradScaler + channels_last (PyTorch's fast path).
Prints RESULT lines: step_ms, clips_s, peak memory.
"""
import argparse
import time

import torch
import torch.nn as nn
import torchvision


def shift(x, n_segment, fold_div=8):
    nt, c, h, w = x.size()
    x = x.view(nt // n_segment, n_segment, c, h, w)
    fold = c // fold_div
    out = torch.zeros_like(x)
    out[:, :-1, :fold] = x[:, 1:, :fold]
    out[:, 1:, fold:2 * fold] = x[:, :-1, fold:2 * fold]
    out[:, :, 2 * fold:] = x[:, :, 2 * fold:]
    return out.view(nt, c, h, w)


class Shifted(nn.Module):
    def __init__(self, conv, n_segment):
        super().__init__()
        self.conv, self.n_segment = conv, n_segment

    def forward(self, x):
        return self.conv(shift(x, self.n_segment))


def tsm_r50(n_segment, classes):
    m = torchvision.models.resnet50(num_classes=classes)
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            blk.conv1 = Shifted(blk.conv1, n_segment)
    m.fc = nn.Sequential(nn.Dropout(0.5), m.fc)
    return m


def run(precision, a):
    torch.backends.cudnn.benchmark = True
    tf32 = False
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dev = torch.device("cuda")
    model = tsm_r50(a.frames, 400).to(dev).train()
    x = torch.randn(a.clips * a.frames, 3, a.size, a.size, device=dev)
    y = torch.randint(0, 400, (a.clips,), device=dev)
    amp = precision == "amp"
    if amp:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    crit = nn.CrossEntropyLoss()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for it in range(a.warmup + a.steps):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            logits = model(x).view(a.clips, a.frames, -1).mean(1)
            loss = crit(logits.float(), y)
        scaler.scale(loss).backward()
        torch.cuda.synchronize()
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    step = times[len(times) // 2]
    mem = torch.cuda.max_memory_allocated() / 2**30
    print("torch %s: step %.1f ms, %.1f clips/s, peak memory %.2f GiB, loss %.4f" %
          (precision, step * 1e3, a.clips / step, mem, loss.item()))
    print("RESULT torch precision=%s clips=%d size=%d step_ms=%.2f clips_s=%.2f mem_gib=%.2f" %
          (precision, a.clips, a.size, step * 1e3, a.clips / step, mem))
    del model, x, y
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precisions", default="fp32,amp",
                   help="comma list of fp32 / amp (gpu_check.sh's alternating rounds: amp)")
    a = p.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    for precision in a.precisions.split(","):
        if precision not in ("fp32", "amp"):
            p.error("unknown precision %r (fp32, amp)" % precision)
        run(precision, a)


if __name__ == "__main__":
    main()
