#!/usr/bin/env bash
# Bytes on the wire per step and final top-1 for each gradient wire format
# (fp32 / fp16 / top-k / sign), on the generated direction dataset,
# through 1 psd + 2 psworker on loopback in sync mode.  Training is
# deterministic per step, so the accuracies do not depend on machine load
# (the times do: they are not reported).  Writes a CSV and prints it.
#
#   bench/scaling/wire_accuracy.sh [--build DIR] [--data DIR] [--steps N] [--out CSV]
#                                  [--formats "fp32:raw fp16:raw fp32:topk fp32:sign"]
#                                  [-- extra psworker flags, e.g. --bn-sync 0]
#
# Configuration (small on purpose: ~4 CPU-minutes per format on one core):
# TSM-ResNet-18 at stem width 32, 32x32 crops, 8 frames, batch 8 per worker
# (16 clips per step), lr 0.02 cosine with 5% warmup, weight decay 1e-4,
# no flip (it would reverse the motion the labels are about), no dropout.
# top-k / sign run with psworker's defaults: per model tensor, DGC momentum
# correction (--dgc-momentum -1: on for sign and top-k <= 1%) and the top-k
# density warm-up over the first steps/4 (docs/scaling.md, wire section).
# Bytes: psd's own counters (headers included) at shutdown, divided by
# steps and workers: what one worker pushes (in) and pulls (out) per step.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../..
build=. data=$src/data/direction steps=400 out= formats="fp32:raw fp16:raw fp32:topk fp32:sign"
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --formats) formats=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "wire_accuracy.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
out=${out:-wire_accuracy.csv}
psd=$build/psd psw=$build/psworker
[ -x "$psd" ] && [ -x "$psw" ] || { echo "wire_accuracy.sh: no psd/psworker in $build" >&2; exit 2; }
[ -f "$data/train.txt" ] && [ -f "$data/val.txt" ] || { echo "wire_accuracy.sh: no $data/train.txt (psdata gen-video)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wireacc.XXXXXX")
pids=()
cleanup() { local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 1' INT TERM
W=2
echo "dtype,codec,steps,workers,batch,push_bytes_per_worker_step,pull_bytes_per_worker_step,fp32_gradient_bytes,top1,top5,val_loss,train_loss" >"$out"
for f in $formats; do
    dt=${f%%:*} codec=${f#*:}
    d=$tmp/$dt-$codec
    mkdir -p "$d"
    # A port below the kernel's ephemeral range (32768+): a port 0 server
    # can get the port of another run's server that just died, and that
    # run's workers, still retrying, then join this cluster.
    for _ in 1 2 3 4 5; do
        port=$((20000 + ($RANDOM * 32768 + $RANDOM) % 12000))
        rm -f "$d/port"
        "$psd" --port $port --port-file "$d/port" --server-id 0 --num-servers 1 --num-workers $W \
            --mode sync --log-level info >"$d/psd.log" 2>&1 &
        spid=$!
        for _ in $(seq 100); do [ -s "$d/port" ] && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
        [ -s "$d/port" ] && break
        wait $spid 2>/dev/null
    done
    pids+=("$spid")
    srv=tcp://127.0.0.1:$(cat "$d/port")
    wp=()
    for ((r = 0; r < W; r++)); do
        "$psw" --servers "$srv" --rank $r --num-workers $W --model tsm-r18 --width 32 --size 32 \
            --frames 8 --train-list "$data/train.txt" --val-list "$data/val.txt" --root "$data" \
            --flip 0 --dropout 0 --lr 0.02 --weight-decay 1e-4 --schedule cosine \
            --warmup-steps $((steps / 20)) --steps "$steps" --batch 8 --threads 1 --loader-threads 1 \
            --dtype "$dt" --codec "$codec" --progress-every 50 --shutdown-servers \
            --out "$d/run" "$@" >"$d/w$r.out" 2>"$d/w$r.err" &
        wp+=($!)
        pids+=($!)
    done
    ok=1
    for p in "${wp[@]}"; do wait "$p" || ok=0; done
    # a failed worker never sends SHUTDOWN: do not wait for psd forever
    [ $ok = 0 ] && kill "$spid" 2>/dev/null
    wait "$spid"
    if [ $ok = 0 ]; then
        echo "wire_accuracy.sh: $dt/$codec failed; logs in $d" >&2
        trap - EXIT
        continue
    fi
    fv() { grep '^final:' "$d/w0.out" | tail -1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    # "stats: N updates, in X MiB, out Y MiB" at shutdown
    io=$(grep 'stats:.*updates, in' "$d/psd.log" | tail -1 | sed 's/.* in \([0-9.]*\) MiB, out \([0-9.]*\) MiB.*/\1 \2/')
    inb=$(echo "$io" | awk -v s="$steps" -v w=$W '{ printf "%.0f", $1 * 1048576 / s / w }')
    outb=$(echo "$io" | awk -v s="$steps" -v w=$W '{ printf "%.0f", $2 * 1048576 / s / w }')
    nparam=$(sed -n "s/.*: \([0-9]*\) trainable parameters.*/\1/p" "$d/w0.err" | head -1)
    row="$dt,$codec,$steps,$W,8,$inb,$outb,$((${nparam:-0} * 4)),$(fv top1),$(fv top5),$(fv val_loss),$(fv loss)"
    echo "$row" >>"$out"
    echo "# $row"
done
cat "$out"
