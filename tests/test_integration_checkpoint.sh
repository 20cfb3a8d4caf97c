#!/usr/bin/env bash
# Checkpoint / restart under load: 2 psd (each with its own checkpoint dir)
# + 3 workers in sync mode.  Mid-run, psd 1 gets SIGTERM (it writes a
# checkpoint and exits 0) and is restarted on the same port with the same
# --checkpoint-dir; the workers' clients retry their unanswered requests and
# training continues.  No update may be lost or applied twice:
#  - every worker checks each partition comes back at version step+1;
#  - rank 0's final weights equal the uninterrupted standalone run's within
#    the fp32 tolerance of test_integration_sync.sh (max |a-b| / max |b| per
#    tensor <= 1e-6; one lost or doubled step would be ~1e-3).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

B=8
STEPS=120
COMMON=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 5
        --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3)
KILL_AT=40

mkdir -p "$T/ckpt0" "$T/ckpt1" "$T/run"
start_psd 0 2 3 --mode sync --checkpoint-dir "$T/ckpt0" &&
    start_psd 1 2 3 --mode sync --checkpoint-dir "$T/ckpt1"
ok $? "2 psd started with checkpoint dirs"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1

# 15 ms of emulated compute per step: the run takes ~2 s, so the kill lands
# mid-run; retries after 200 ms keep the outage short.
wp=()
for r in 0 1 2; do
    timeout -k 2 50 "$PSW" --servers "$SERVERS" --rank $r --num-workers 3 --out "$T/run" \
        --progress-every 0 --log-level warn "${COMMON[@]}" --batch $B --step-sleep-ms 15 \
        --retry-ms 200 --timeout-ms 20000 >"$T/run/w$r.out" 2>"$T/run/w$r.err" &
    wp+=($!)
    PIDS+=($!)
done

# Wait until rank 0 has done KILL_AT steps (its CSV is line-buffered).
seen=0
for _ in $(seq 1 600); do
    seen=$(csv_rows "$T/run/metrics-rank0.csv")
    [ "$seen" -ge $KILL_AT ] && break
    sleep 0.01
done
[ "$seen" -ge $KILL_AT ] && [ "$seen" -lt $STEPS ]
ok $? "run reached step $seen of $STEPS before the kill"

kill -TERM "$PID_1"
wait "$PID_1"
rc=$?
ok $rc "psd 1 exited 0 on SIGTERM (status $rc)"
ls "$T/ckpt1"/* >/dev/null 2>&1
ok $? "psd 1 left a checkpoint in its dir ($(ls "$T/ckpt1" | tr '\n' ' '))"
during=$(csv_rows "$T/run/metrics-rank0.csv")

sleep 0.3  # the workers are now retrying against a dead server
PS_PORT=$PORT_1 start_psd 1 2 3 --mode sync --checkpoint-dir "$T/ckpt1"
ok $? "psd 1 restarted on port $PORT_1 from its checkpoint dir"
diag "killed at step ~$during"

rc=0
for r in 0 1 2; do
    wait "${wp[$r]}" || { rc=1; echo "# worker $r failed"; show_log "$T/run/w$r.err"; }
done
ok $rc "all 3 workers finished $STEPS steps through the restart"
[ $rc -eq 0 ] || show_log "$T/psd1.log" 30
# the restarted psd says which checkpoint it resumed from
grep -iE 'load.*checkpoint|checkpoint.*load' "$T/psd1.log" | sed 's/^/# /'
grep -qiE 'load.*checkpoint|checkpoint.*load' "$T/psd1.log"
ok $? "restarted psd 1 logged loading its checkpoint"

standalone "$T/ref" "${COMMON[@]}" --batch $((3 * B))
ok $? "standalone reference (uninterrupted)"
compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 1e-6
ok $? "weights after the restart == uninterrupted reference (no lost or doubled update)"
tap_done
