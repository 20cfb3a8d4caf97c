#!/usr/bin/env bash
# Asynchronous and bounded-staleness (k=2) modes: 2 psd + 3 workers train
# the smoke model; the result must converge: final eval loss (held-out
# samples, rank 0 after pulling the servers' final weights) below half of
# the initial eval loss.  Async results depend on arrival order, so the
# check is convergence, not equality.  One worker is slowed down so that
# the others really run ahead of it (staleness happens, and with k=2 some
# of its gradients may be refused as too stale and dropped).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

COMMON=(--steps 150 --batch 8 --lr 0.05 --momentum 0.9 --partition-bytes 2048
        --seed 7 --data-seed 3)

run_mode() {  # run_mode NAME PSD-FLAGS...
    local name=$1 r rc=0; shift
    start_cluster 2 3 "$@"
    ok $? "$name: 2 psd started ($*)"
    mkdir -p "$T/$name"
    local wp=()
    for r in 0 1 2; do
        # rank 2 sleeps 3 ms per step: the other two get ahead of it
        local slow=()
        [ $r = 2 ] && slow=(--step-sleep-ms 3)
        timeout -k 2 50 "$PSW" --servers "$SERVERS" --rank $r --num-workers 3 --mode "$MODE" \
            --out "$T/$name" --progress-every 0 --log-level warn "${COMMON[@]}" "${slow[@]}" \
            >"$T/$name/w$r.out" 2>"$T/$name/w$r.err" &
        wp+=($!)
        PIDS+=($!)
    done
    for r in 0 1 2; do
        wait "${wp[$r]}" || { rc=1; show_log "$T/$name/w$r.err"; }
    done
    ok $rc "$name: 3 workers finished"
    local i e d
    i=$(final_value "$T/$name/w0.out" init_eval_loss)
    e=$(final_value "$T/$name/w0.out" eval_loss)
    d=$(final_value "$T/$name/w2.out" stale_drops)
    diag "$name: eval loss $i -> $e; slow rank's stale drops: $d"
    [ -n "$e" ] && [ -n "$i" ] && fcmp "$e < 0.5 * $i"
    ok $? "$name: converged (eval loss $e < 0.5 x initial $i)"
    stop_pids
    PIDS=()
}

MODE=async run_mode async --mode async
MODE=ssp run_mode ssp2 --mode ssp --staleness 2
tap_done
