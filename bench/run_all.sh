#!/bin/bash
# The benchmark session recorded in docs/performance.md.  Run it alone (no
# build, test or other benchmark at the same time) from a build directory:
#   sh /path/to/src/bench/run_all.sh [BUILDDIR]
B=${1:-.}
SRC=$(cd "$(dirname "$0")/.." && pwd)
cd "$B" || exit 1
echo "### uptime: $(uptime)"
echo "### psbench fp32 raw, then against ps-lite and the bare-TCP floor (where ../shared has the peer)"
timeout 600 ./psbench --servers 1,2 --workers 1,2 --bytes 25M,100M --dtype fp32 --codec raw --iters 20
timeout 3600 bash "$SRC/bench/pslite_compare.sh" . 3
echo "### psbench fp16/bf16/lz4/topk/sign"
timeout 600 ./psbench --servers 1,2 --workers 1,2 --bytes 25M --dtype fp16,bf16 --codec raw --iters 15 --pump-seconds 0
timeout 600 ./psbench --servers 1,2 --workers 1,2 --bytes 25M --dtype fp32,fp16 --codec lz4 --iters 15 --pump-seconds 0
timeout 600 ./psbench --servers 1,2 --workers 1,2 --bytes 25M --dtype fp32 --codec topk,sign --iters 15 --pump-seconds 0
echo "### codec_bench"
timeout 300 ./bench/codec_bench
echo "### engine_bench"
timeout 900 sh "$SRC/bench/engine_bench.sh" . 10
echo "### ring_bench"
timeout 600 sh "$SRC/bench/ring_bench.sh" .
echo "### loader_bench (frames, shards, video files on the fly)"
for g in 12 125; do
    timeout 900 ./bench/loader_bench --dir "/tmp/loader-bench-gop$g" --videos 64 --frames 250 --size 320 \
        --gop $g --short-side 256 --crop 224 --segments 8 --batch 8 --batches 16 --threads 2 --mode train
done
timeout 900 ./bench/loader_bench --dir /tmp/loader-bench-gop12 --videos 64 --frames 250 --size 320 --gop 12 \
    --short-side 256 --crop 224 --segments 8 --batch 4 --batches 4 --threads 2 --mode test --clips 10
echo "### uptime: $(uptime)"
