#!/usr/bin/env bash
# A worker stopped (SIGSTOP) for longer than psd's --worker-timeout-ms, then
# resumed, under the two --on-worker-loss policies (2 psd + 2 psworker,
# smoke model, sync; docs/reliability.md):
#  wait (the default): psd declares rank 1 lost and says so, the step
#    waits for it and psd names it as the one it waits for, rank 0 warns
#    which server and partitions it waits on; after SIGCONT both finish
#    and nothing is lost: rank 0's weights equal a fault-free run's bit
#    for bit, and its final line says both ranks contributed every step.
#  continue: the job goes on with rank 0 alone while rank 1 is stopped;
#    the resumed rank 1 is answered with newer versions, catches up with
#    the servers (it neither fails nor trains on stale weights) and both
#    finish; the final line says how many steps each rank contributed
#    (rank_steps=200,K with K < 200, matching the steps rank 1 says it
#    missed).  Rank 0 sleeps 30 ms a step there, so it cannot finish the
#    job alone before rank 1 is back.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }

STEPS=60
COMMON=(--batch 8 --lr 0.05 --momentum 0.9 --partition-bytes 2048 --seed 3 --data-seed 4
        --retry-ms 200 --timeout-ms 40000 --stall-warn-ms 1000)
WAITRUN=("${COMMON[@]}" --steps $STEPS --step-sleep-ms 10)
CSTEPS=200
CONTRUN=("${COMMON[@]}" --steps $CSTEPS --step-sleep-ms 30)
PSDF=(--mode sync --worker-timeout-ms 1000 --heartbeat-ms 200)

# one run: POLICY OUTDIR [psworker flags]; rank 1 is stopped for 2.5 s once
# rank 0 is at step 20
paused_run() {
    local pol=$1 out=$2; shift 2
    start_cluster 2 2 "${PSDF[@]}" --on-worker-loss "$pol" || return 1
    fc_start_worker 0 "" "$out" "$@" --shutdown-servers; P0=$WPID
    fc_start_worker 1 "" "$out" "$@"; P1=$WPID; C1=$WCHILD
    fc_wait_rows "$out/metrics-rank0.csv" 20 >/dev/null
    kill -STOP "$C1"
    sleep 2.5
    cp "$T/psd0.log" "$out/psd0.stopped.log"
    kill -CONT "$C1"
    wait "$P0"; RC0=$?
    wait "$P1"; RC1=$?
    await_exit 30 "$PID_0" "$PID_1"
    mv "$T/psd0.log" "$out/psd0.log"; mv "$T/psd1.log" "$out/psd1.log"
}

# ---- reference, no fault ----
start_cluster 2 2 "${PSDF[@]}"
ok $? "reference: 2 psd started"
run_workers 2 "$T/ref" "${WAITRUN[@]}" --shutdown-servers
ok $? "reference: 2 workers trained $STEPS steps"
await_exit 30 "$PID_0" "$PID_1"
rm -f "$T/psd0.log" "$T/psd1.log"

# ---- wait ----
paused_run wait "$T/wait" "${WAITRUN[@]}"
[ "$RC0" = 0 ] && [ "$RC1" = 0 ]
ok $? "wait: both workers finished after rank 1 was stopped 2.5 s (exit $RC0 / $RC1)" ||
    { show_log "$T/wait/w0.err"; show_log "$T/wait/w1.err"; }
grep -q 'worker rank 1 lost: silent .*steps wait for it' "$T/wait/psd0.stopped.log"
ok $? "wait: psd declared rank 1 lost and logged that the steps wait for it" ||
    show_log "$T/wait/psd0.stopped.log"
grep -E 'server [01] \(tcp://[^)]*\): [0-9]+ request\(s\) unanswered .* partition' "$T/wait/w0.err" | head -n 1 | sed 's/^/# /'
grep -qE 'server [01] \(tcp://[^)]*\): [0-9]+ request\(s\) unanswered .* partition' "$T/wait/w0.err"
ok $? "wait: rank 0 warned, naming the server, its endpoint and the partitions" ||
    show_log "$T/wait/w0.err"
grep -q 'worker rank 1 is back' "$T/wait/psd0.log"
ok $? "wait: psd saw rank 1 back"
compare "$T/wait/model.safetensors" "$T/ref/model.safetensors" 0 "" --bytes
ok $? "wait: rank 0's weights == the fault-free run's, bit for bit (nothing lost)"
[ "$(final_value "$T/wait/w0.out" rank_steps)" = "$STEPS,$STEPS" ]
ok $? "wait: final line rank_steps=$(final_value "$T/wait/w0.out" rank_steps) (every step from both)"

# ---- continue ----
paused_run continue "$T/cont" "${CONTRUN[@]}"
[ "$RC0" = 0 ] && [ "$RC1" = 0 ]
ok $? "continue: both workers finished (exit $RC0 / $RC1)" ||
    { show_log "$T/cont/w0.err"; show_log "$T/cont/w1.err"; }
grep -q 'worker rank 1 lost: silent' "$T/cont/psd0.stopped.log"
ok $? "continue: psd declared rank 1 lost"
grep -h 'caught up with the servers' "$T/cont/w1.err" | sed 's/^/# /'
# every catch-up counts (a second one follows when rank 0 had gone on again)
missed=$(sed -n 's/.*caught up with the servers at step [0-9]* (\([0-9]*\) step(s) of this rank missed).*/\1/p' "$T/cont/w1.err" |
    awk '{ n++; t += $1 } END { if (n) print t }')
ncatch=$(grep -c 'caught up with the servers at step' "$T/cont/w1.err")
[ -n "$missed" ] && [ "$missed" -gt 0 ]
ok $? "continue: rank 1 caught up with the servers after missing ${missed:-?} step(s) in $ncatch catch-up(s)"
rs=$(final_value "$T/cont/w0.out" rank_steps)
diag "rank 0's final line: rank_steps=$rs"
# Rank 1 contributed every step it did not miss, less up to two per
# catch-up that went without it: the step it was stopped in (its pushes
# came back as retries) and the step it caught up at, which rank 0 may
# have pushed alone to a server that had not yet seen rank 1 back (under
# load, seen once: rank_steps=200,147 after 51 missed).
k=${rs#*,}
[ "${rs%%,*}" = "$CSTEPS" ] && [ -n "$missed" ] && [ "$k" -lt "$CSTEPS" ] &&
    [ "$k" -ge $((CSTEPS - missed - 2 * ncatch)) ] && [ "$k" -le $((CSTEPS - missed)) ]
ok $? "continue: the final line says rank 0 contributed $CSTEPS steps and rank 1 ${k:-?} (missed ${missed:-?})"
[ "$(final_value "$T/cont/w1.out" rank_steps)" = "$rs" ]
ok $? "continue: rank 1's final line says the same"
tap_done
