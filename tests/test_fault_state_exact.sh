#!/usr/bin/env bash
# The whole state of a video model comes back byte for byte through a psd
# SIGKILL (rollback) and a rank-0 SIGKILL (restart): 2 psd + 2 psworker
# train a narrow TSM ResNet-18 (BN in training mode, dropout 0.5, random
# flips, dynamic loss scaling with a growth window of 4 and an overflow
# on rank 1 at step 12), with aligned checkpoints every 5 steps.
#  1. psd 1 is SIGKILLed at a placed moment (tests/lib/fault_cluster.sh:
#     workers stopped, an aligned checkpoint A durable, partitions past it)
#     and restarted; the workers roll back to A and redo the steps since,
#     the loss scale replayed from the servers' verdicts, BN
#     num_batches_tracked and the dropout masks set from the step.
#  2. Rank 0 dies between its pushes of step 20 (--debug-die-mid-step) and
#     is restarted: it resumes at 20 with the weights and BN statistics of
#     version 20 (the servers'), num_batches_tracked = 20 and the loss
#     scale of step 20 (replayed), and writes the model at the end.
# Checked against the same cluster run without faults: rank 0's
# model.safetensors (weights, BN running statistics, num_batches_tracked)
# and psctl export of the servers are equal byte for byte, the export
# equals the model file, num_batches_tracked = steps, and the loss scale's
# final line (scale, steps skipped) is the same.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

STEPS=30
N=5
K=12        # rank 1's gradient overflows at this step
DIE_AT=20   # rank 0 dies between its pushes of this step
"$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 32 --seed 4 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 16-video dataset"
COMMON=(--model tsm-r18 --width 8 --size 32 --frames 4 --threads 1 --loader-threads 1
        --train-list "$T/ds/train.txt" --root "$T/ds" --batch 2 --steps $STEPS
        --lr 0.02 --momentum 0.9 --weight-decay 1e-4 --seed 5 --data-seed 9
        --partition-bytes 65536 --loss-scale dynamic --loss-scale-window 4
        --retry-ms 200 --timeout-ms 40000)
PSDF=(--mode sync --checkpoint-every-steps $N)
SPEC_OF_RANK1=(--debug-overflow-at $K)

# export_and_stop OUTDIR: psctl export (shapes from rank 0's model file), then shutdown
export_and_stop() {
    "$PSCTL" --servers "$SERVERS" export "$1/export.safetensors" --like "$1/model.safetensors" \
        >"$1/export.out" 2>&1 &&
        "$PSCTL" --servers "$SERVERS" shutdown >>"$1/export.out" 2>&1
    local rc=$?
    await_exit 30 "$PID_0" "$PID_1"
    return $rc
}

# ---- reference: the same cluster, no fault ----
mkdir -p "$T/rck0" "$T/rck1"
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/rck0" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/rck1"
ok $? "reference: 2 psd started"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
fc_start_worker 0 "" "$T/ref" "${COMMON[@]}"; R0=$WPID
fc_start_worker 1 "" "$T/ref" "${COMMON[@]}" "${SPEC_OF_RANK1[@]}"; R1=$WPID
wait "$R0" && wait "$R1"
ok $? "reference: 2 workers trained $STEPS steps" || { show_log "$T/ref/w0.err"; show_log "$T/ref/w1.err"; }
export_and_stop "$T/ref"
ok $? "reference: psctl export, then shutdown" || show_log "$T/ref/export.out"
mv "$T/psd0.log" "$T/ref/psd0.log"; mv "$T/psd1.log" "$T/ref/psd1.log"

# ---- the faulty run ----
mkdir -p "$T/ck0" "$T/ck1"
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/ck0" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/ck1"
ok $? "2 psd started"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
fc_start_worker 0 "" "$T/run" "${COMMON[@]}" --debug-die-mid-step $DIE_AT; W0=$WPID; C0=$WCHILD
fc_start_worker 1 "" "$T/run" "${COMMON[@]}" "${SPEC_OF_RANK1[@]}"; W1=$WPID; C1=$WCHILD

fc_wait_rows "$T/run/metrics-rank0.csv" $((2 * N)) >/dev/null
FC_PAST_CSV=$T/run/metrics-rank0.csv fc_psd_lost_and_back 1 $((2 * N)) "$T/ck1" "$C0" "$C1"
placed=$?
seen=$(csv_rows "$T/run/metrics-rank0.csv")
[ $placed -eq 0 ] && [ "$seen" -lt $DIE_AT ]
ok $? "psd 1 SIGKILLed with the workers stopped at step $seen (partitions at ..${FC_VMAX:-?}, aligned checkpoint ${FC_A:-?} durable) and restarted"
fc_died_mid_step "$W0" "$T/run/w0.err"
ok $? "rank 0 killed itself between its pushes of step $DIE_AT"
mv "$T/run/metrics-rank0.csv" "$T/run/metrics-rank0.first.csv"
fc_start_worker 0 ".restart" "$T/run" "${COMMON[@]}"; W0=$WPID
rc=0
wait "$W0" || { rc=1; show_log "$T/run/w0.restart.err"; }
wait "$W1" || { rc=1; show_log "$T/run/w1.err"; }
ok $rc "restarted rank 0 and rank 1 finished"
[ "$(final_value "$T/run/w0.restart.out" steps)" = $STEPS ]
ok $? "rank 0 reports steps=$STEPS"
export_and_stop "$T/run"
ok $? "psctl export, then shutdown" || show_log "$T/run/export.out"

grep -h 'rolled back from' "$T/psd0.log" | sed 's/^/# /'
grep -q "rolled back from .* to ${FC_A:-x} " "$T/psd0.log" &&
    cat "$T/run/w0.err" "$T/run/w1.err" | grep -q "rolled back to step ${FC_A:-x} "
ok $? "the survivor and the workers rolled back to ${FC_A:-?}" ||
    { show_log "$T/psd0.log"; show_log "$T/run/w0.err"; show_log "$T/run/w1.err"; }
grep -h 'resuming at step\|loss scale: replayed' "$T/run/w0.restart.err" "$T/run/w1.err" | sed 's/^/# /'
grep -q "resuming at step $DIE_AT" "$T/run/w0.restart.err" &&
    grep -q "loss scale: replayed steps 0..$DIE_AT " "$T/run/w0.restart.err"
ok $? "restarted rank 0 resumed at step $DIE_AT with the loss scale replayed"

compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 0 "" --bytes
ok $? "rank 0's model (weights, BN statistics, num_batches_tracked) == the fault-free run's, byte for byte"
compare "$T/run/export.safetensors" "$T/ref/export.safetensors" 0 "" --bytes
ok $? "psctl export == the fault-free run's, byte for byte"
compare "$T/run/export.safetensors" "$T/run/model.safetensors" 0 "" --bytes
ok $? "psctl export == rank 0's model file (every tensor, num_batches_tracked included)"
# num_batches_tracked read straight from the file (tests/tools/st_i64, not psworker)
nbt=$("$top_builddir/tests/tools/st_i64" "$T/run/model.safetensors" num_batches_tracked 2>&1)
[ "$nbt" = "$STEPS" ]
ok $? "every num_batches_tracked = $STEPS (found: $nbt)"
lsr=$(grep -h 'loss scale: final' "$T/ref/w0.err" | sed 's/.*loss scale: //')
lsf=$(grep -h 'loss scale: final' "$T/run/w0.restart.err" | sed 's/.*loss scale: //')
diag "reference: $lsr; faulty run: $lsf"
[ -n "$lsr" ] && [ "$lsr" = "$lsf" ] && echo "$lsr" | grep -q ' 1 of '
ok $? "rank 0's final loss scale and skipped steps equal the fault-free run's (one step skipped)"
tap_done
