#!/bin/sh
# Whole TSM-ResNet-18 training step, CUDA backend against the CPU reference
# (same weights, input, labels, dropout seed): loss, logits, every parameter
# gradient, BN running statistics.  The comparison lives in
# bench/gpu_bench.c ("check" mode, TAP output); exits 77 without a GPU.
b=${top_builddir:-.}
exec "$b/bench/gpu_bench" check
