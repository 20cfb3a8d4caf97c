#!/usr/bin/env bash
# --overlap: the per-layer gradient hand-off and per-layer
# weight waits change WHEN partitions travel, never WHAT is computed.  So the
# same short cluster run (2 psd + 2 workers, sync, narrow TSM-R18, BN in
# training mode so the BN-statistics partitions travel too, validation every
# 2 steps so the loop must wait for every weight in mid-run) must end with
# bit-identical model files (weights and statistics, both ranks) with
# --overlap on and off: fp32 wire and fp16 wire; and async mode with one
# worker (deterministic there).  The "on" runs must really have overlapped:
# their log counts pushes handed off during backward and replies awaited by
# the next forward's layers.  --loss-scale turns the hand-off off (psd skips
# an overflowed update per partition: docs/cuda.md), and says so.
# A psd SIGKILL mid-run with --overlap on (rollback through the hooks) ends
# with the fault-free run's weights, bit for bit.
# Control: one step fewer gives a different file (the comparison can fail).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q -- '--overlap' || { echo "1..0 # SKIP psworker without --overlap"; exit 77; }

K=5
"$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 32 --seed 3 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 16-video dataset"
DATA=(--train-list "$T/ds/train.txt" --root "$T/ds" --val-list "$T/ds/train.txt" --val-every 2)
# 16 KiB partitions: ~40 of them over 2 servers, so pushes and pulls
# interleave with the layers; dropout on (the mask is per forward: the
# validation forwards must not shift it either)
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0.5 --threads 1
       --loader-threads 1 --momentum 0.9 --lr 0.05 --seed 5 --data-seed 9 --batch 2
       --partition-bytes 16384 --bn train --save-all-ranks --log-level info)

stop_cluster() {
    local p
    stop_pids
    PIDS=()
}

# run NAME NSERVERS NWORKERS MODE [psworker flags]: files in $T/NAME
run() {
    local name=$1 ns=$2 nw=$3 mode=$4; shift 4
    start_cluster "$ns" "$nw" --mode "$mode" || return 1
    run_workers "$nw" "$T/$name" "${MODEL[@]}" "${DATA[@]}" --mode "$mode" "$@"
    local rc=$?
    stop_cluster
    return $rc
}

# same NAME_ON NAME_OFF NWORKERS: every rank's file identical, bit for bit
same() {
    local r f
    for ((r = 0; r < $3; r++)); do
        f=model.safetensors && [ $r -gt 0 ] && f=model-rank$r.safetensors
        "$STC" "$T/$1/$f" "$T/$2/$f" --tol 0 >"$T/cmp-$1-$r" 2>&1
        ok $? "$1 vs $2: rank $r's weights and BN statistics identical: $(head -c 200 "$T/cmp-$1-$r")"
    done
}

for wire in fp32 fp16; do
    run "on-$wire" 2 2 sync --steps $K --dtype $wire --overlap on
    ok $? "sync, $wire wire, --overlap on: 2 psd + 2 workers, $K steps"
    run "off-$wire" 2 2 sync --steps $K --dtype $wire --overlap off
    ok $? "sync, $wire wire, --overlap off"
    same "on-$wire" "off-$wire" 2
    overlapped "on-$wire"
    ! grep -q -- 'handed off during backward' "$T/off-$wire/w0.err"
    ok $? "off-$wire: no hand-off"
done
v_on=$(final_value "$T/on-fp32/w0.out" top1) v_off=$(final_value "$T/off-fp32/w0.out" top1)
[ -n "$v_on" ] && [ "$v_on" = "$v_off" ]
ok $? "validation after the last step: top1 $v_on with overlap, $v_off without"

# default: on for a video model without loss scaling
run def 2 2 sync --steps $K
ok $? "sync, default --overlap"
same def on-fp32 2
overlapped def

run a-on 2 1 async --steps $K --overlap on
ok $? "async, 1 worker, --overlap on"
run a-off 2 1 async --steps $K --overlap off
ok $? "async, 1 worker, --overlap off"
same a-on a-off 1
overlapped a-on

run ls 1 2 sync --steps 2 --overlap on --loss-scale static:256
ok $? "sync, --loss-scale static:256 with --overlap on"
grep -q -- '--overlap off: loss scaling is on' "$T/ls/w0.err"
ok $? "loss scaling turns the hand-off off, and the log says why"

# A psd SIGKILLed mid-run and restarted from its aligned checkpoint (as in
# tests/test_fault_psd_kill.sh, here with the hooks on): the ROLLBACK
# verdict arrives in a reply checked by the next forward's hook, the step
# stops before any push, every server rolls back, and the steps are redone.
# Dropout 0 and frozen BN: the dropout mask and BN's num_batches_tracked
# follow the worker's own forward counter, which the redone steps move on
# (with --overlap off too); everything the servers hold is compared.
FS=30 FN=5
FAULT=(--steps $FS --dropout 0 --bn frozen --retry-ms 200 --timeout-ms 30000 --step-sleep-ms 40)
start_cluster 2 2 --mode sync --checkpoint-every-steps $FN --checkpoint-dir "$T/rck" &&
    run_workers 2 "$T/fref" "${MODEL[@]}" "${DATA[@]}" --mode sync "${FAULT[@]}" --overlap off
ok $? "fault reference: $FS steps, no fault, --overlap off"
stop_cluster
mkdir -p "$T/ck0" "$T/ck1" "$T/fault"
start_psd 0 2 2 --mode sync --checkpoint-every-steps $FN --checkpoint-dir "$T/ck0" &&
    start_psd 1 2 2 --mode sync --checkpoint-every-steps $FN --checkpoint-dir "$T/ck1"
ok $? "2 psd with --checkpoint-every-steps $FN"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
WP=()
for r in 0 1; do
    timeout -k 2 100 "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 --out "$T/fault" \
        --progress-every 0 "${MODEL[@]}" "${DATA[@]}" --mode sync "${FAULT[@]}" --overlap on \
        >"$T/fault/w$r.out" 2>"$T/fault/w$r.err" &
    WP+=($!)
    PIDS+=($!)
done
for _ in $(seq 1 1000); do [ "$(csv_rows "$T/fault/metrics-rank0.csv")" -ge 12 ] && break; sleep 0.02; done
seen=$(csv_rows "$T/fault/metrics-rank0.csv")
kill -KILL "$PID_1"
wait "$PID_1" 2>/dev/null
sleep 0.3
PS_PORT=$PORT_1 start_psd 1 2 2 --mode sync --checkpoint-every-steps $FN --checkpoint-dir "$T/ck1"
ok $? "psd 1 SIGKILLed at rank 0's step $seen and restarted"
rc=0
for r in 0 1; do wait "${WP[$r]}" || { rc=1; show_log "$T/fault/w$r.err"; }; done
ok $rc "both workers finished $FS steps through the psd kill with --overlap on"
grep -q 'rolled back to step' "$T/fault/w0.err"
ok $? "worker 0 rolled back: $(grep -h 'rolled back to step' "$T/fault/w0.err" | head -n 1 | sed 's/.*INFO[^:]*: //')"
overlapped fault
same fault fref 2
stop_cluster

run short 2 2 sync --steps $((K - 1)) --overlap on
ok $? "control run: $((K - 1)) steps"
"$STC" "$T/short/model.safetensors" "$T/off-fp32/model.safetensors" --tol 0 >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "control: one step fewer gives a different file (the comparison can fail)"
tap_done
