#!/bin/bash
# End-to-end mixed-precision training on a GPU, the product path:
# psd + 2 psworkers sharing the GPU (--device cuda), TSM-ResNet-18 on the
# generated direction dataset with the recipe of ./deploy/local-cluster.sh
# (half width, 48x48, 8 frames, batch 8 per worker, cosine lr 0.02), once
# per precision: fp32, fp16 (dynamic loss scaling) and bf16.  Prints each
# run's final line (val top-1, step time, comm wait, loss-scale skips,
# device memory) and fails when a half run ends more than 0.05 below the
# fp32 run's top-1 or below 0.9 -- mixed precision must train as well.
#
#   bench/gpu_train.sh BINDIR [STEPS]     (default 500 steps)
# PS_GPU_TRAIN_DEVICE=cpu runs the fp32 run on the CPU (a dry run of this
# script on a machine without a GPU: the half runs then fail by design).
# BINDIR holds psd, psworker, psdata (bench/gpu_prep.sh carries them in
# tests/test_cuda_carry; gpu_check.sh calls this as its last stage).
# Logs: $OUT/gpu_train/ when $OUT is set, else /tmp/ps-gpu-train/.
set -u
BIN=${1:?usage: bench/gpu_train.sh BINDIR [STEPS]}
STEPS=${2:-500}
W=${OUT:+$OUT/gpu_train}
W=${W:-/tmp/ps-gpu-train}
D=/tmp/ps-gpu-train-data
mkdir -p "$W" || exit 1
for b in psd psworker psdata; do
    [ -x "$BIN/$b" ] || { echo "gpu_train: $BIN/$b not found (run bench/gpu_prep.sh)"; exit 1; }
done
if [ ! -f "$D/val.txt" ]; then
    "$BIN/psdata" gen-video --out "$D" --videos 800 --frames 16 --size 48 --seed 1 --classes 4 \
        >"$W/gen.log" 2>&1 || { tail -5 "$W/gen.log"; exit 1; }
fi
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; PIDS=(); }
trap cleanup EXIT INT TERM
status=0
declare -A TOP1
for prec in fp32 fp16 bf16; do
    R=$W/$prec
    mkdir -p "$R"
    rm -f "$R/port"
    "$BIN/psd" --port 0 --port-file "$R/port" --server-id 0 --num-servers 1 --num-workers 2 \
        --mode sync >"$R/psd.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do [ -s "$R/port" ] && break; sleep 0.05; done
    S=tcp://127.0.0.1:$(cat "$R/port")
    t0=$(date +%s)
    wp=()
    for r in 0 1; do
        timeout -k 5 170 "$BIN/psworker" --servers "$S" --rank $r --num-workers 2 --mode sync \
            --device "${PS_GPU_TRAIN_DEVICE:-cuda}" --precision $prec --model tsm-r18 --out "$R" \
            --train-list "$D/train.txt" --val-list "$D/val.txt" --root "$D" \
            --size 48 --frames 8 --width 32 --lr 0.02 --weight-decay 1e-4 --schedule cosine \
            --warmup-steps $((STEPS / 20)) --val-every $((STEPS / 4)) --threads 2 --loader-threads 2 \
            --flip 0 --dropout 0 --steps "$STEPS" --batch 8 --partition-bytes 4194304 \
            --progress-every 0 >"$R/w$r.out" 2>"$R/w$r.err" &
        wp+=($!)
    done
    rc=0
    for p in "${wp[@]}"; do wait "$p" || rc=1; done
    cleanup
    t=$(( $(date +%s) - t0 ))
    fin=$(grep -h '^final:' "$R/w0.out" | head -1)
    echo "$prec rc=$rc wall_s=$t: $fin"
    grep -h 'loss scale: final\|overlap' "$R/w0.err" | tail -2
    if [ $rc != 0 ] || [ -z "$fin" ]; then
        tail -8 "$R/w0.err"; status=1; continue
    fi
    TOP1[$prec]=$(echo "$fin" | tr ' ' '\n' | sed -n 's/^val_top1=//p;s/^top1=//p' | head -1)
done
ref=${TOP1[fp32]:-}
for prec in fp16 bf16; do
    v=${TOP1[$prec]:-}
    [ -n "$v" ] && [ -n "$ref" ] || { echo "RESULT train $prec: no top-1"; status=1; continue; }
    okv=$(awk -v v="$v" -v r="$ref" 'BEGIN { print (v >= 0.9 && v >= r - 0.05) ? 1 : 0 }')
    echo "RESULT train precision=$prec top1=$v fp32_top1=$ref $([ "$okv" = 1 ] && echo ok || echo FAILED)"
    [ "$okv" = 1 ] || status=1
done
exit $status
