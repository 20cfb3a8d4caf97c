#!/usr/bin/env bash
# A lost shard loses nothing, without a disk (docs/reliability.md): 2 psd +
# 2 psworker (smoke model, sync, --replicate-state: each worker keeps the
# weights of two versions and the momentum of half the partitions, brought
# by their PUSHPULL replies).  psd 1 is SIGKILLed at a placed moment (the
# workers stopped, mid-run) and its checkpoint directory deleted; a fresh,
# empty psd takes its port.  Its first answers say it holds nothing
# (PS_FLAG_REBUILD); every worker gives it the spec and the partitions it
# keeps, pulls, and the job goes on from the servers' versions.  Checked:
# both workers finish; psd 1 rebuilt every partition it owns from the
# workers' copies; no step was lost or redone (no rollback; psd 0 applied
# exactly steps x partitions updates; every partition ends at version
# steps); rank 0's final weights are byte-equal to a fault-free run without
# --replicate-state (so keeping state changes no arithmetic either).  Done
# with the fp32 wire and with fp16 (the workers hold fp16-rounded weights;
# the kept copies are exact).  A third case loses psd 1 between its replies
# of one update, deterministically (psd --debug-die-before-state-reply):
# the worker that keeps that partition never gets the new version, the
# other one does and goes a step ahead; the partition is rebuilt from the
# keeper's older copy, so the worker ahead must compute that step again
# (told so by psd 1, or by its own pull), while the one behind waits for its
# push.  The same checks hold, and the workers may not wait on each other.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }

STEPS=120
COMMON=(--steps $STEPS --batch 8 --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --partition-bytes 2048
        --seed 7 --data-seed 3 --retry-ms 200 --timeout-ms 40000)
PSDF=(--mode sync --checkpoint-every-steps 10)

# one_case NAME kill|state [psworker flags]: psd 1 SIGKILLed by the test
# with the workers stopped, or dying by itself before a keeper's reply
one_case() {
    local name=$1 how=$2; shift 2
    # ---- reference: no fault, no --replicate-state ----
    mkdir -p "$T/$name/rck0" "$T/$name/rck1"
    start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/$name/rck0" &&
        start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/$name/rck1"
    SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
    run_workers 2 "$T/$name/ref" "${COMMON[@]}" "$@" --shutdown-servers
    ok $? "$name: reference run ($STEPS steps, no fault)"
    await_exit 30 "$PID_0" "$PID_1"
    rm -f "$T/psd0.log" "$T/psd1.log"

    # ---- psd 1 lost with its disk ----
    mkdir -p "$T/$name/ck0" "$T/$name/ck1"
    local die=()
    [ "$how" = state ] && die=(--debug-die-before-state-reply 41)
    start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$T/$name/ck0" &&
        start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/$name/ck1" "${die[@]}"
    SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
    local out=$T/$name/run
    fc_start_worker 0 "" "$out" "${COMMON[@]}" "$@" --replicate-state --step-sleep-ms 10
    local w0=$WPID c0=$WCHILD
    fc_start_worker 1 "" "$out" "${COMMON[@]}" "$@" --replicate-state --step-sleep-ms 10
    local w1=$WPID c1=$WCHILD
    local seen
    if [ "$how" = kill ]; then
        seen=$(fc_wait_rows "$out/metrics-rank0.csv" 40)
        kill -STOP "$c0" "$c1"
        is_live "$PID_1" && kill -KILL "$PID_1"
        wait "$PID_1" 2>/dev/null
    else
        # psd 1 dies by itself at version 41; the workers retry meanwhile
        seen=41
        await_exit 60 "$PID_1"
        grep -q 'answered to all but its keeper; SIGKILL' "$T/psd1.log"
        ok $? "$name: psd 1 died between its replies of version 41, the keeper's not sent" ||
            show_log "$T/psd1.log"
    fi
    rm -rf "$T/$name/ck1"
    mv "$T/psd1.log" "$out/psd1.killed.log"
    PS_PORT=$PORT_1 start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$T/$name/ck1"
    ok $? "$name: psd 1 lost at step ~$seen, its checkpoint directory deleted, a fresh one started"
    [ "$how" = kill ] && kill -CONT "$c0" "$c1"
    local rc=0
    wait "$w0" || rc=1
    wait "$w1" || rc=1
    ok $rc "$name: both workers finished" || { show_log "$out/w0.err"; show_log "$out/w1.err"; }
    local up0 owned0 v1
    up0=$(fc_stat 0 updates); owned0=$(fc_stat 0 owned_partitions)
    v1=$("$PSCTL" --servers "tcp://127.0.0.1:$PORT_1" status --json 2>/dev/null |
        sed -n 's/^[[:space:]]*"version\(_max\)*":[[:space:]]*\([0-9]*\).*/\2/p' | sort -u | tr '\n' ' ')
    "$PSCTL" --servers "$SERVERS" shutdown >/dev/null 2>&1
    await_exit 30 "$PID_0" "$PID_1"
    grep -h 'rebuilding it from\|going on at step' "$out/w0.err" | head -n 2 | sed 's/^/# /'
    local nreb nown1
    nreb=$(grep -c 'rebuilt at version [0-9]* from rank' "$T/psd1.log")
    grep -q 'compute step [0-9]* again' "$T/psd1.log" &&
        diag "psd 1 told a worker a step ahead of a rebuilt partition to compute that step again"
    nown1=$(sed -n 's/.*this server owns \([0-9]*\) .*/\1/p' "$T/psd1.log" | head -n 1)
    cat "$out/w0.err" "$out/w1.err" | grep -q 'rebuilding it from the workers' &&
        [ -n "$nown1" ] && [ "$nreb" = "$nown1" ]
    ok $? "$name: the fresh psd 1 rebuilt all its $nreb of ${nown1:-?} partitions from the workers' copies" ||
        show_log "$T/psd1.log"
    ! grep -q 'rolled back' "$T/psd0.log" "$T/psd1.log" && [ -n "$up0" ] &&
        [ "$up0" = $((STEPS * owned0)) ] && [ "$v1" = "$STEPS " ]
    ok $? "$name: no step lost or redone: psd 0 applied $up0 = $STEPS x $owned0 updates, psd 1 ends at version $v1, no rollback"
    [ "$(final_value "$out/w0.out" steps)" = $STEPS ]
    ok $? "$name: rank 0 reports steps=$STEPS"
    compare "$out/model.safetensors" "$T/$name/ref/model.safetensors" 0 "" --bytes
    ok $? "$name: final weights byte-equal to the fault-free run's"
    rm -f "$T/psd0.log" "$T/psd1.log"
}
one_case fp32 kill
one_case fp16 kill --dtype fp16
one_case keeper-behind state
tap_done
