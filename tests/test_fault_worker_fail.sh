#!/usr/bin/env bash
# A sync job never trains on with fewer workers, and never waits in silence
# (real psd + psworker processes on loopback; docs/reliability.md):
#  1. a worker whose HELLO is refused (another --partition-bytes: another
#     partition table) stops the job: both workers exit non-zero within
#     seconds, rank 0 naming rank 1 and the cause, and rank 0 writes no model;
#  2. a worker whose data loader fails (every frame of its copy of the data
#     truncated) stops the job: rank 0 exits 1 naming rank 1 and the frame,
#     psd logs the failure, rank 0 writes no model;
#  3. a wrong port for one server: the worker warns within seconds naming
#     that server's endpoint and that nothing listens there;
#  4. psctl shutdown while the workers train: they stop within seconds,
#     saying the server shut down, instead of waiting for their timeout;
#  5. a psd stopped (SIGSTOP) for a few seconds: the workers warn, naming
#     the server and the partitions they wait for, and finish normally once
#     it runs again (exit 0);
#  6. a normal run: each worker's BYE says it finished (psd logs it);
#  7. rank 1 given only one of the two servers: its HELLO is refused naming
#     --servers, and the job stops for rank 0 too, within seconds (before:
#     rank 0 hung and psd 1 reported 2/2 workers live);
#  8. one worker without its --train-list: it exits 2 at once naming the
#     flag, and the other does not wait in silence: within seconds it warns
#     about server 0's barrier and relays what psd says it waits for
#     ("waiting for rank 1 (never connected)").
# Each case is bounded well under a minute; no assertion reads a duration
# except as a generous upper bound.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
PSCTL=$top_builddir/psctl
[ -x "$PSDATA" ] && [ -x "$PSCTL" ] || { echo "1..0 # SKIP psdata / psctl not built"; exit 77; }

SMOKE=(--model smoke --batch 8 --lr 0.05 --stall-warn-ms 1000)

# wait_exit PID SECONDS: the exit status, or 124 if it runs longer
wait_exit() {
    local pid=$1 s=$2
    for _ in $(seq 1 $((s * 10))); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid"; return $?; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
}

# worker NAME RANK [flags]: start a psworker in the background; sets WPID
worker() {
    local name=$1 r=$2; shift 2
    "$PSW" --rank "$r" --num-workers 2 --progress-every 0 --log-level info "$@" \
        >"$T/$name.out" 2>"$T/$name.err" &
    WPID=$!
    PIDS+=("$WPID")
}

# ---- 1. HELLO refused ------------------------------------------------------
start_cluster 1 2 || exit 1
worker h0 0 --servers "$SERVERS" "${SMOKE[@]}" --steps 50 --out "$T/h"
p0=$WPID
# rank 0 first: the table the cluster has is rank 0's, rank 1's is the other
for _ in $(seq 1 100); do grep -q "HELLO: rank 0" "$T/psd0.log" && break; sleep 0.1; done
worker h1 1 --servers "$SERVERS" "${SMOKE[@]}" --steps 50 --partition-bytes 1024
p1=$WPID
wait_exit "$p1" 30; rc1=$?
wait_exit "$p0" 30; rc0=$?
[ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] && grep -q "hash" "$T/h1.err"
ok $? "rank 1 with another partition table: HELLO refused, exit $rc1" || show_log "$T/h1.err"
[ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && grep -q "worker rank 1 cannot join" "$T/h0.err"
ok $? "rank 0 stops too (exit $rc0), naming rank 1: it cannot join" || show_log "$T/h0.err"
! grep -q '^final:' "$T/h0.out" && [ ! -e "$T/h/model.safetensors" ]
ok $? "rank 0 printed no final line and wrote no model"
kill -TERM "$PID_0" 2>/dev/null; wait "$PID_0" 2>/dev/null

# ---- 2. a data loader that fails -------------------------------------------
"$PSDATA" gen-video --out "$T/ds" --videos 8 --frames 4 --size 32 --seed 2 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote an 8-video dataset"
cp -r "$T/ds" "$T/bad"
find "$T/bad" -name 'img_*.jpg' -exec truncate -s 100 {} +
VIDEO=(--model tsm-r18 --width 8 --size 32 --frames 4 --dropout 0 --threads 1 --loader-threads 1
       --lr 0.02 --steps 20 --batch 2 --partition-bytes 65536 --train-list "$T/ds/train.txt"
       --stall-warn-ms 1000)
start_cluster 1 2 || exit 1
worker v0 0 --servers "$SERVERS" "${VIDEO[@]}" --root "$T/ds" --out "$T/v"
p0=$WPID
worker v1 1 --servers "$SERVERS" "${VIDEO[@]}" --root "$T/bad"
p1=$WPID
wait_exit "$p1" 40; rc1=$?
wait_exit "$p0" 40; rc0=$?
[ $rc1 = 1 ] && grep -q "img_0000" "$T/v1.err"
ok $? "rank 1's loader fails on a truncated frame: exit $rc1" || show_log "$T/v1.err"
[ $rc0 = 1 ] && grep -q "worker rank 1 failed" "$T/v0.err" && grep -q "img_0000" "$T/v0.err"
ok $? "rank 0 stops (exit $rc0) with rank 1's error, naming the frame" || show_log "$T/v0.err"
grep -q "worker rank 1 failed" "$T/psd0.log"
ok $? "psd logged that rank 1 failed and the job stopped" || show_log "$T/psd0.log"
! grep -q '^final:' "$T/v0.out" && [ ! -e "$T/v/model.safetensors" ]
ok $? "rank 0 printed no final line and wrote no model"
kill -TERM "$PID_0" 2>/dev/null; wait "$PID_0" 2>/dev/null

# ---- 3. a wrong port for server 1 ------------------------------------------
start_psd 0 2 1 || exit 1
read -r bad _ < <(free_ports 1)
worker wp 0 --servers "tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$bad" --num-workers 1 \
    "${SMOKE[@]}" --steps 5 --timeout-ms 6000
wait_exit "$WPID" 30; rc=$?
grep -q "server 1 (tcp://127.0.0.1:$bad).*unanswered.*HELLO" "$T/wp.err" &&
    grep -qi "refused" "$T/wp.err"
ok $? "wrong port for server 1: the warning names tcp://127.0.0.1:$bad and 'connection refused'" ||
    show_log "$T/wp.err"
[ $rc -ne 0 ] && [ $rc -ne 124 ]
ok $? "... and the worker gives up at its --timeout-ms (exit $rc)"
kill -TERM "$PID_0" 2>/dev/null; wait "$PID_0" 2>/dev/null

# ---- 4. psctl shutdown while training ----------------------------------------
start_cluster 1 2 || exit 1
worker s0 0 --servers "$SERVERS" "${SMOKE[@]}" --steps 2000 --step-sleep-ms 20 --out "$T/s"
p0=$WPID
worker s1 1 --servers "$SERVERS" "${SMOKE[@]}" --steps 2000 --step-sleep-ms 20
p1=$WPID
for _ in $(seq 1 200); do [ "$(csv_rows "$T/s/metrics-rank0.csv")" -ge 5 ] && break; sleep 0.1; done
"$PSCTL" --servers "$SERVERS" shutdown >"$T/psctl.out" 2>&1
ok $? "psctl shutdown acknowledged" || show_log "$T/psctl.out"
wait_exit "$p0" 20; rc0=$?
wait_exit "$p1" 20; rc1=$?
[ $rc0 = 1 ] && [ $rc1 = 1 ] && grep -q "shut down" "$T/s0.err" && grep -q "shut down" "$T/s1.err"
ok $? "both workers stop within seconds (exit $rc0 / $rc1), saying the server shut down" ||
    { show_log "$T/s0.err"; show_log "$T/s1.err"; }
wait "$PID_0" 2>/dev/null

# ---- 5. a psd stopped for a while ------------------------------------------
start_cluster 1 2 || exit 1
worker t0 0 --servers "$SERVERS" "${SMOKE[@]}" --steps 200 --step-sleep-ms 20 --out "$T/t"
p0=$WPID
worker t1 1 --servers "$SERVERS" "${SMOKE[@]}" --steps 200 --step-sleep-ms 20
p1=$WPID
for _ in $(seq 1 200); do [ "$(csv_rows "$T/t/metrics-rank0.csv")" -ge 5 ] && break; sleep 0.1; done
kill -STOP "$PID_0"
for _ in $(seq 1 100); do grep -q "unanswered" "$T/t0.err" && break; sleep 0.1; done
kill -CONT "$PID_0"
grep -q "server 0 (tcp://127.0.0.1:$PORT_0).*unanswered.*PUSHPULL of partition" "$T/t0.err"
ok $? "psd stopped: the worker warns, naming server 0, its endpoint and the partitions" ||
    show_log "$T/t0.err"
wait_exit "$p0" 40; rc0=$?
wait_exit "$p1" 40; rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] && grep -q '^final:.*steps=200' "$T/t0.out"
ok $? "... and both finish once it runs again (exit $rc0 / $rc1)"

# ---- 6. a normal end -------------------------------------------------------
grep -q "worker rank 0 finished (BYE)" "$T/psd0.log" && grep -q "worker rank 1 finished (BYE)" "$T/psd0.log"
ok $? "each worker's BYE says it finished" || show_log "$T/psd0.log"
kill -TERM "$PID_0" 2>/dev/null; wait "$PID_0" 2>/dev/null

# ---- 7. rank 1 given one of the two servers ----------------------------------
start_cluster 2 2 || exit 1
worker o0 0 --servers "$SERVERS" "${SMOKE[@]}" --steps 50 --out "$T/o"
p0=$WPID
worker o1 1 --servers "tcp://127.0.0.1:$PORT_0" "${SMOKE[@]}" --steps 50
p1=$WPID
wait_exit "$p1" 20; rc1=$?
wait_exit "$p0" 20; rc0=$?
[ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] && grep -q -- "--servers lists 1 server(s), the cluster has 2" "$T/o1.err"
ok $? "rank 1 with one of two servers: HELLO refused naming --servers (exit $rc1)" ||
    show_log "$T/o1.err"
[ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && grep -q "worker rank 1 cannot join.*--servers" "$T/o0.err"
ok $? "rank 0 stops too (exit $rc0), naming rank 1 and --servers" || show_log "$T/o0.err"
kill -TERM "$PID_0" "$PID_1" 2>/dev/null; wait "$PID_0" "$PID_1" 2>/dev/null

# ---- 8. one worker without its --train-list ----------------------------------
start_cluster 1 2 || exit 1
NOLIST=()
for a in "${VIDEO[@]}"; do [ "$a" = "$T/ds/train.txt" ] || [ "$a" = --train-list ] || NOLIST+=("$a"); done
worker l0 0 --servers "$SERVERS" "${VIDEO[@]}" --root "$T/ds" --timeout-ms 8000
p0=$WPID
worker l1 1 --servers "$SERVERS" "${NOLIST[@]}" --root "$T/ds"
p1=$WPID
wait_exit "$p1" 20; rc1=$?
[ $rc1 = 2 ] && grep -q -- "--train-list" "$T/l1.err"
ok $? "rank 1 without --train-list exits $rc1 at once, naming the flag" || show_log "$T/l1.err"
for _ in $(seq 1 100); do grep -q "says: barrier" "$T/l0.err" && break; sleep 0.1; done
grep -h "unanswered.*BARRIER\|says: barrier" "$T/l0.err" | head -n 2 | sed 's/^/# /'
grep -q "server 0 (tcp://127.0.0.1:$PORT_0).*unanswered.*BARRIER" "$T/l0.err" &&
    grep -q "server 0 (tcp://127.0.0.1:$PORT_0) says: barrier: 1 of 2 workers arrived.*waiting for rank 1 (never connected)" "$T/l0.err"
ok $? "rank 0 does not wait in silence: it warns about the barrier and relays psd's 'waiting for rank 1 (never connected)'" ||
    show_log "$T/l0.err"
wait_exit "$p0" 30; rc0=$?
[ $rc0 -ne 0 ] && [ $rc0 -ne 124 ]
ok $? "... and gives up at its --timeout-ms (exit $rc0)"
kill -TERM "$PID_0" 2>/dev/null; wait "$PID_0" 2>/dev/null
tap_done
