#!/usr/bin/env bash
# --overlap for the detectors: the per-layer hand-off (the backbone's
# blocks, the FPN, the RPN head, the box stages, the mask branch;
# RetinaNet's FPN and two heads) changes WHEN partitions travel, never WHAT
# is computed.  Short cluster runs (2 psd + 2 workers, sync, narrow
# detectors at 64x64, 16 KiB partitions so a step moves tens of them,
# validation after step 2 so the loop waits for every weight in mid-run)
# end with bit-identical model files on both ranks and the same final loss
# with --overlap on and off, for Faster, Mask and Cascade R-CNN and
# RetinaNet.  Bit for bit because the hand-off moves the same gradient
# values (copied out of the model once their group's backward is done)
# and psd sums the workers' gradients in rank order whatever the arrival
# order.  The "on" runs must really have overlapped: their log counts
# pushes handed off during backward and replies awaited by the next
# forward's layers.  --clip-grad (the whole gradient rescaled after
# backward) turns the hand-off off and says why; the default (no flag) is
# on.  Control: one step fewer gives a different file.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

K=4
"$PSDATA" gen-det --out "$T/ds" --images 8 --val-images 2 --size 64 --classes 3 --seed 2 \
    --min-objects 1 --max-objects 3 --masks >"$T/gen.out" 2>"$T/gen.err"
ok $? "psdata gen-det wrote an 8 + 2 image dataset with masks"
DATA=(--train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train"
      --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val" --val-every 2)
COMMON=(--width 8 --fpn-channels 16 --box-head-dim 32 --box-batch 32 --mask-head-dim 8
        --size 64 --freeze-at 2 --threads 1 --loader-threads 1 --lr 0.01 --momentum 0.9
        --seed 5 --data-seed 9 --score-thresh 0.001 --batch 2 --partition-bytes 16384
        --save-all-ranks --log-level info)

# run NAME MODEL [psworker flags]: 2 psd + 2 workers, sync; files in $T/NAME
run() {
    local name=$1 model=$2; shift 2
    start_cluster 2 2 --mode sync || return 1
    run_workers 2 "$T/$name" --model "$model" "${COMMON[@]}" "${DATA[@]}" --mode sync "$@"
    local rc=$?
    stop_pids
    PIDS=()
    return $rc
}

# same A B: both ranks' files identical, bit for bit, and the same final loss
same() {
    local r f l1 l2
    for r in 0 1; do
        f=model.safetensors && [ $r -gt 0 ] && f=model-rank$r.safetensors
        "$STC" "$T/$1/$f" "$T/$2/$f" --tol 0 >"$T/cmp-$1-$r" 2>&1
        ok $? "$1 vs $2: rank $r's weights identical: $(head -c 160 "$T/cmp-$1-$r")"
    done
    l1=$(final_value "$T/$1/w0.out" loss) l2=$(final_value "$T/$2/w0.out" loss)
    [ -n "$l1" ] && [ "$l1" = "$l2" ]
    ok $? "$1 vs $2: final loss $l1 and $l2"
}

for m in fasterrcnn-r18 maskrcnn-r18 cascade-r18 retinanet-r18; do
    run "$m-on" $m --steps $K --overlap on
    ok $? "$m, --overlap on: 2 psd + 2 workers, $K sync steps"
    run "$m-off" $m --steps $K --overlap off
    ok $? "$m, --overlap off"
    same "$m-on" "$m-off"
    overlapped "$m-on"
    ! grep -q -- 'handed off during backward' "$T/$m-off/w0.err"
    ok $? "$m-off: no hand-off"
done

run def fasterrcnn-r18 --steps $K
ok $? "fasterrcnn-r18, default --overlap"
same def fasterrcnn-r18-off
overlapped def

run clip retinanet-r18 --steps 1 --overlap on --clip-grad 10
ok $? "retinanet-r18 with --clip-grad 10 and --overlap on"
grep -q -- '--overlap off: --clip-grad' "$T/clip/w0.err" &&
    ! grep -q -- 'handed off during backward' "$T/clip/w0.err"
ok $? "--clip-grad turns the hand-off off, and the log says why"

run short fasterrcnn-r18 --steps $((K - 1)) --overlap on
ok $? "control run: $((K - 1)) steps"
"$STC" "$T/short/model.safetensors" "$T/fasterrcnn-r18-off/model.safetensors" --tol 0 >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "control: one step fewer gives a different file (the comparison can fail)"
tap_done
