#!/usr/bin/env bash
# Server SIGKILL with running workers, through the real psworker
# and client library: 2 psd + 2 psworker (smoke model, sync, fp32), psd
# --checkpoint-every-steps N (aligned checkpoints at versions k*N).
#  1. psd 1 is SIGKILLed mid-run and restarted like systemd would (same
#     flags, same port).  It loads its aligned checkpoint of version V and
#     answers the workers' pushes for later steps ERROR(PS_ESTATE,
#     PS_FLAG_ROLLBACK, V); the workers roll both servers back to V
#     (MSG_ROLLBACK), pull, and recompute from step V.
#     The kill is placed, not timed: both workers are SIGSTOPped, and psd 1
#     is killed only once its STATS say an aligned checkpoint A is durable
#     and no partition is at A + N yet (else the workers go on a moment and
#     it looks again), so at most N steps are redone whatever the load.
#  2. Later worker 1 dies between its pushes of a step
#     (--debug-die-mid-step: half of its partitions pushed and updated with
#     rank 0's gradient, i.e. one step ahead, the rest never sent) and is
#     restarted with its rank: it skips the start barrier and must compute
#     that step from the weights of that step's version on every partition
#     (psd keeps one version back; PULL with PS_FLAG_EXACT), not from the
#     partitions one ahead.
# Checks: both workers finish all steps; at most one checkpoint interval of
# progress is recomputed (the survivor's rollback log line); and rank 0's
# final weights equal those of the same cluster run without faults.  The
# bound is 1e-6 relative (st_compare norm_rel), but equality is expected
# bit for bit: the sums are in rank order, the restored weights and
# momentum are exact fp32 copies, and a step's data depends only on the
# step, so the steps redone are the same arithmetic; one lost or doubled
# step would show as ~1e-3, a step computed from mixed versions as ~1e-5.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }

B=8
STEPS=140
N=10
COMMON=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 5
        --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3 --batch $B
        --retry-ms 200 --timeout-ms 30000)
KILL_PSD_AT=45    # from here on: not at a multiple of N, progress since the last checkpoint is lost
KILL_W_AT=120     # worker 1 dies between its pushes of this step
PSDF=(--mode sync --checkpoint-every-steps $N)

# ---- reference: the same cluster, no fault ----
mkdir -p "$T/rck0" "$T/rck1"
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/rck0" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/rck1"
ok $? "reference: 2 psd started"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
run_workers 2 "$T/ref" "${COMMON[@]}" --shutdown-servers
ok $? "reference: 2 workers finished $STEPS steps without faults"
await_exit 30 "$PID_0" "$PID_1"
mv "$T/psd0.log" "$T/ref/psd0.log"; mv "$T/psd1.log" "$T/ref/psd1.log"

# ---- the faulty run ----
mkdir -p "$T/ck0" "$T/ck1" "$T/run"
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/ck0" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/ck1"
ok $? "2 psd started with --checkpoint-every-steps $N"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
fc_start_worker 0 "" "$T/run" "${COMMON[@]}" --step-sleep-ms 15; W0=$WPID; C0=$WCHILD
fc_start_worker 1 "" "$T/run" "${COMMON[@]}" --step-sleep-ms 15 --debug-die-mid-step $KILL_W_AT
W1=$WPID; C1=$WCHILD

fc_wait_rows "$T/run/metrics-rank0.csv" $KILL_PSD_AT >/dev/null
seen=$(csv_rows "$T/run/metrics-rank0.csv")
FC_PAST_CSV=$T/run/metrics-rank0.csv fc_psd_lost_and_back 1 $N "$T/ck1" "$C0" "$C1"
placed=$?
a=$FC_A vmax=$FC_VMAX
[ $placed -eq 0 ] && [ "$seen" -ge $KILL_PSD_AT ] && [ "$seen" -lt $KILL_W_AT ]
ok $? "psd 1 SIGKILLed with the workers stopped after step $seen (>= $KILL_PSD_AT, < $KILL_W_AT): its partitions at ..${vmax:-?}, aligned checkpoint ${a:-?} durable; restarted on port $PORT_1 with the same flags"
fc_died_mid_step "$W1" "$T/run/w1.err"
ok $? "worker 1 killed itself between its pushes of step $KILL_W_AT"
grep 'debug-die-mid-step' "$T/run/w1.err" | sed 's/^/# /'
fc_start_worker 1 ".restart" "$T/run" "${COMMON[@]}" --step-sleep-ms 15; W1=$WPID

rc=0
wait "$W0" || { rc=1; echo "# worker 0 failed"; show_log "$T/run/w0.err"; }
wait "$W1" || { rc=1; echo "# restarted worker 1 failed"; show_log "$T/run/w1.restart.err"; }
ok $rc "both workers finished through a psd SIGKILL and a worker SIGKILL"
[ $rc -eq 0 ] || { show_log "$T/psd0.log" 20; show_log "$T/psd1.log" 20; }
[ "$(final_value "$T/run/w0.out" steps)" = "$STEPS" ] && [ "$(final_value "$T/run/w1.restart.out" steps)" = "$STEPS" ]
ok $? "both report steps=$STEPS"

grep 'loaded checkpoint' "$T/psd1.log" | tail -n 1 | sed 's/^/# /'
line=$(grep 'loaded checkpoint' "$T/psd1.log" | tail -n 1)
V=$(echo "$line" | sed -n 's/.*versions \([0-9]*\)\.\.\([0-9]*\).*/\1 \2/p')
set -- $V
[ -n "${1:-}" ] && [ "$1" = "$2" ] && [ "$1" = "$a" ]
ok $? "restarted psd 1 loaded its aligned checkpoint (versions ${1:-?}..${2:-?}, = $a)"
V=${1:-0}

grep 'rolled back from' "$T/psd0.log" | sed 's/^/# /'
rb=$(grep 'rolled back from' "$T/psd0.log" | head -n 1)
lost=$(echo "$rb" | sed -n 's/.*versions [0-9]*\.\.\([0-9]*\) to \([0-9]*\).*/\1 \2/p')
set -- $lost
[ -n "${1:-}" ] && [ "$2" = "$V" ] && [ $(($1 - $2)) -le $N ]
ok $? "survivor psd 0 rolled back from ${1:-?} to $V: $(( ${1:-0} - V )) step(s) redone <= one interval ($N)"
grep -q 'rolling every server back' "$T/run/w0.err" && grep -q 'rolled back to step' "$T/run/w0.err"
ok $? "worker 0 logged the rollback"
grep -q 'joining the running job' "$T/run/w1.restart.err"
ok $? "restarted worker 1 joined the running job (no start barrier)"
grep -E 'resuming at step [0-9]+|one step ahead' "$T/run/w1.restart.err" | sed 's/^/# /'
rs=$(sed -n 's/.*resuming at step \([0-9]*\).*/\1/p' "$T/run/w1.restart.err" | head -n 1)
[ "$rs" = "$KILL_W_AT" ]
ok $? "restarted worker 1 resumed at the step it died in ($KILL_W_AT), not 0 nor the step after"
grep -q "partition(s) one step ahead.*pulled at version $KILL_W_AT" "$T/run/w1.restart.err"
ok $? "and pulled the partitions one step ahead at version $KILL_W_AT"

compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 1e-6
ok $? "final weights == the fault-free run's (norm_rel <= 1e-6; expected bitwise equal)"
compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 0 "" --bytes
ok $? "and bitwise equal (every tensor's bytes)"
tap_done
