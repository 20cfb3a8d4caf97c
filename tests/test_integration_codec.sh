#!/usr/bin/env bash
# psworker's compressed pushes and CURVE, end to end on loopback:
#  * --codec topk --topk-ratio 0.1 and --codec sign (error feedback in the
#    client): 2 psd + 2 workers train the smoke model in sync mode; lossy
#    pushes change the weights, so the check is convergence: the final eval
#    loss (rank 0, held-out samples) below half the initial eval loss.  A
#    run whose pushes carried nothing useful stays near the initial loss
#    (ln 4 = 1.39), far above that bound.
#  * CURVE: 2 psd with --curve (each its own key pair, the workers' public
#    keys on the allow-list), 2 workers with --curve-server-key
#    srv0.pub,srv1.pub (one key file per server) train the smoke model with
#    fp32/raw pushes; the final weights must equal the standalone reference
#    (max relative difference <= 1e-6, as in test_integration_sync.sh), so
#    encryption changes nothing in the numbers.  A worker without keys gets
#    no answer from a CURVE server and fails (timeout) instead of training.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

B=8
COMMON=(--steps 120 --lr 0.05 --momentum 0.9 --partition-bytes 2048 --seed 7 --data-seed 3)

stop_all() {
    local p
    stop_pids
    PIDS=()
}

lossy() {  # lossy NAME PSWORKER-FLAGS...
    local name=$1 i e; shift
    start_cluster 2 2 --mode sync
    ok $? "$name: 2 psd started"
    run_workers 2 "$T/$name" "${COMMON[@]}" --batch $B "$@"
    ok $? "$name: 2 workers finished ($*)"
    i=$(final_value "$T/$name/w0.out" init_eval_loss)
    e=$(final_value "$T/$name/w0.out" eval_loss)
    diag "$name: eval loss $i -> $e"
    [ -n "$e" ] && [ -n "$i" ] && fcmp "$e < 0.5 * $i"
    ok $? "$name: converged (eval loss $e < 0.5 x initial $i)"
    # the pushes really went lossy: the weights are not the raw-wire ones
    compare "$T/$name/model.safetensors" "$T/ref/model.safetensors" 1e-6 >/dev/null
    [ $? -eq 1 ]
    ok $? "$name: weights differ from the exact (raw wire) reference"
    stop_all
}

standalone "$T/ref" "${COMMON[@]}" --batch $((2 * B))
ok $? "standalone reference with batch $((2 * B))"
lossy topk --codec topk --topk-ratio 0.1
lossy sign --codec sign

# ---- CURVE ---------------------------------------------------------------------
PSCTL=$top_builddir/psctl
if [ ! -x "$PSCTL" ] || ! "$PSD" --help 2>&1 | grep -q -- '--curve-allow'; then
    diag "CURVE part skipped: psctl not built or psd without --curve"
    tap_n=$((tap_n + 1)); echo "ok $tap_n # SKIP CURVE (psctl / psd --curve unavailable)"
    tap_done
fi
if ! "$PSCTL" keygen "$T/srv0" >"$T/kg.out" 2>&1; then
    if grep -q "without CURVE" "$T/kg.out"; then
        tap_n=$((tap_n + 1)); echo "ok $tap_n # SKIP libzmq without CURVE"
        tap_done
    fi
    show_log "$T/kg.out"
    ok 1 "psctl keygen"
    tap_done
fi
"$PSCTL" keygen "$T/srv1" >/dev/null 2>&1 && "$PSCTL" keygen "$T/w0" >/dev/null 2>&1 &&
    "$PSCTL" keygen "$T/w1" >/dev/null 2>&1
ok $? "CURVE key pairs for 2 servers and 2 workers"
cat "$T/w0.pub" "$T/w1.pub" >"$T/allow.txt"

SERVERS=
for i in 0 1; do
    start_psd $i 2 2 --mode sync --curve --curve-secret-key "$T/srv$i.key" \
        --curve-allow "$T/allow.txt" || break
    eval "SERVERS=\${SERVERS:+\$SERVERS,}tcp://127.0.0.1:\$PORT_$i"
done
[ -n "$PORT_1" ]
ok $? "2 psd --curve started ($SERVERS)"

# A worker without keys: the servers drop its unauthenticated connection,
# so HELLO is never answered; it must fail within its timeout, not train.
mkdir -p "$T/plain"
timeout -k 2 30 "$PSW" --servers "$SERVERS" --num-workers 2 --rank 0 --steps 2 --batch $B \
    --timeout-ms 1500 --retry-ms 300 --progress-every 0 --log-level error \
    >"$T/plain/w0.out" 2>"$T/plain/w0.err"
rc=$?
[ $rc = 1 ]
ok $? "a worker without CURVE keys gets no answer and exits 1 (got $rc)" || show_log "$T/plain/w0.err"

# per-rank key flags: run_workers passes the same flags to every rank, so
# start the two ranks by hand
mkdir -p "$T/curve"
wp=()
for r in 0 1; do
    timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 \
        --out "$T/curve" --progress-every 0 --log-level warn "${COMMON[@]}" --batch $B \
        --curve-server-key "$T/srv0.pub,$T/srv1.pub" --curve-public-key "$T/w$r.pub" \
        --curve-secret-key "$T/w$r.key" >"$T/curve/w$r.out" 2>"$T/curve/w$r.err" &
    wp+=($!)
    PIDS+=($!)
done
rc=0
for r in 0 1; do wait "${wp[$r]}" || { rc=1; show_log "$T/curve/w$r.err"; }; done
ok $rc "CURVE: 2 workers trained through 2 encrypting psd"
compare "$T/curve/model.safetensors" "$T/ref/model.safetensors" 1e-6
ok $? "CURVE: cluster weights == standalone weights (max rel diff <= 1e-6)"

# bad key flags are refused before connecting
"$PSW" --servers "$SERVERS" --curve-server-key "$T/srv0.pub" >/dev/null 2>"$T/partial.err"
[ $? = 2 ] && grep -q "all three" "$T/partial.err"
ok $? "a partial CURVE key set is refused (exit 2, names the three flags)"
"$PSW" --servers "$SERVERS" --num-workers 2 --curve-server-key "$T/srv0.pub,$T/srv1.pub,$T/srv0.pub" \
    --curve-public-key "$T/w0.pub" --curve-secret-key "$T/w0.key" --timeout-ms 1000 \
    >/dev/null 2>"$T/nkeys.err"
[ $? = 1 ] && grep -q "one per server" "$T/nkeys.err"
ok $? "3 server key files for 2 servers are refused" || show_log "$T/nkeys.err"
printf 'not-a-key\n' >"$T/bad.pub"
"$PSW" --servers "$SERVERS" --num-workers 2 --curve-server-key "$T/bad.pub" \
    --curve-public-key "$T/w0.pub" --curve-secret-key "$T/w0.key" --timeout-ms 1000 \
    >/dev/null 2>"$T/badkey.err"
[ $? = 1 ] && grep -q "bad.pub" "$T/badkey.err"
ok $? "a malformed key file is refused, naming the file" || show_log "$T/badkey.err"
stop_all
tap_done
