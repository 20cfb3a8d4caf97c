#!/usr/bin/env bash
# Checkpoint writes on a full disk: 2 psd + 2 psworker (smoke model, sync,
# --checkpoint-every-steps N), every checkpoint directory on a small tmpfs
# (one per server) filled up to its last page, so every checkpoint file (a few
# pages) fails with
# ENOSPC while the small failure note psd leaves still fits.
#  1. The job trains to the end (the workers need no checkpoint).  Nothing
#     may report a checkpoint as done: STATS aligned_checkpoint_version 0,
#     checkpoint_version -1, checkpoint_writes 0, checkpoint_failures > 0
#     (counted in errors) with the cause in checkpoint_last_error; /metrics
#     psd_checkpoint_failures_total the same; the log names the file and
#     the cause, rate-limited (fewer lines than failures); psctl checkpoint
#     gets ERROR naming the cause; SIGTERM: the final checkpoint fails, psd
#     exits 1.  Then the disk is freed: psctl checkpoint succeeds, STATS
#     moves (aligned_checkpoint_version = the version written), SHUTDOWN:
#     exit 0.
#  2. A job run with --shutdown-servers: training succeeded, so both
#     workers exit 0; both psd cannot write their final checkpoint, stop
#     anyway and exit 1.
#  3. psd 1 SIGKILLed mid-run and restarted: it has no checkpoint, so the
#     job cannot go on; the workers' error says so and why ("server 1 has
#     no checkpoint of this job (its last write failed: ... No space left on
#     device)").
# Needs root (mount -t tmpfs); exit 77 (skip) otherwise.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

skip() { echo "1..0 # SKIP $*"; exit 77; }
PSCTL=$top_builddir/psctl
[ -x "$PSCTL" ] || skip "$PSCTL not built"
[ "$(id -u)" = 0 ] || skip "needs root to mount a small tmpfs (a disk that fills up)"
PAGE=$(getconf PAGESIZE 2>/dev/null || echo 4096)
# One small tmpfs per server, so that neither takes the other's last page.
FULL=$(mktemp -d "${TMPDIR:-/tmp}/ps-full.XXXXXX")
mkdir -p "$FULL/0" "$FULL/1"
full_cleanup() {
    it_cleanup
    umount "$FULL/0" 2>/dev/null
    umount "$FULL/1" 2>/dev/null
    rm -rf "$FULL" 2>/dev/null
}
trap full_cleanup EXIT
mount -t tmpfs -o size=128k tmpfs "$FULL/0" 2>/dev/null && mount -t tmpfs -o size=128k tmpfs "$FULL/1" 2>/dev/null ||
    skip "cannot mount a tmpfs here (no CAP_SYS_ADMIN?)"

N=5
COMMON=(--lr 0.05 --momentum 0.9 --partition-bytes 2048 --seed 7 --data-seed 3 --batch 8
        --retry-ms 200 --timeout-ms 20000)
PSDF=(--mode sync --checkpoint-every-steps $N --stats-every-s 0)

# fill_disk NAME: fresh directories FULL/0/NAME and FULL/1/NAME, then each
# tmpfs filled but one page: room for psd's failure note, not for a
# checkpoint file (> 2 pages).
fill_disk() {
    local i
    for i in 0 1; do
        rm -rf "${FULL:?}/$i"/*
        mkdir -p "$FULL/$i/$1"
        dd if=/dev/zero of="$FULL/$i/fill" bs="$PAGE" 2>/dev/null
        truncate -s "-$PAGE" "$FULL/$i/fill"
    done
}
# stats ID KEY: one field of server ID's STATS (psctl status --json).
stats() {
    "$PSCTL" --servers "$SERVERS" --server "$1" --interval-ms 0 status --json 2>/dev/null |
        sed -n "s/^[[:space:]]*\"$2\":[[:space:]]*\"\{0,1\}\([^\",]*\).*/\1/p" | head -n 1
}
# wait_exit PID: its exit status, or 124 if it runs on after 20 s.
wait_exit() {
    local i
    for i in $(seq 1 400); do
        kill -0 "$1" 2>/dev/null || { wait "$1"; return $?; }
        sleep 0.05
    done
    return 124
}
# metrics PORT: GET /metrics over bash's /dev/tcp.
metrics() {
    exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
    cat <&3
    exec 3<&-
}

# ---- 1. a whole job on a full disk, then the disk freed -------------------
fill_disk a
MPORT=$(free_ports 1)
t_start=$(date +%s)
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/0/a" --metrics-port "$MPORT" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/1/a"
ok $? "2 psd started, checkpoint dirs on a full tmpfs"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
run_workers 2 "$T/a" "${COMMON[@]}" --steps 60
ok $? "2 workers trained 60 steps (checkpoints fail, training goes on)"

fails=$(stats 0 checkpoint_failures)
diag "server 0 STATS: checkpoint_failures=$fails errors=$(stats 0 errors)" \
    "aligned_checkpoint_version=$(stats 0 aligned_checkpoint_version)" \
    "checkpoint_version=$(stats 0 checkpoint_version) checkpoint_writes=$(stats 0 checkpoint_writes)"
[ "$(stats 0 aligned_checkpoint_version)" = 0 ] && [ "$(stats 1 aligned_checkpoint_version)" = 0 ]
ok $? "STATS aligned_checkpoint_version stays 0 on both servers: no aligned file was written"
[ "$(stats 0 checkpoint_version)" = -1 ] && [ "$(stats 0 checkpoint_writes)" = 0 ]
ok $? "STATS checkpoint_version -1, checkpoint_writes 0"
! ls "$FULL"/0/a/*.safetensors >/dev/null 2>&1 && ! ls "$FULL"/1/a/*.safetensors >/dev/null 2>&1
ok $? "and indeed no checkpoint file exists"
[ -n "$fails" ] && [ "$fails" -ge 2 ] && [ "$fails" -le $((60 / N)) ] && [ "$(stats 1 checkpoint_failures)" -ge 2 ]
ok $? "STATS checkpoint_failures counts the failed aligned writes ($fails of $((60 / N)) versions)"
[ "$(stats 0 errors)" -ge "$fails" ]
ok $? "STATS errors counts them ($(stats 0 errors) >= $fails)"
last=$(stats 0 checkpoint_last_error)
[[ $last == *"$FULL/0/a/psd-0-"*"No space left on device"* ]]
ok $? "STATS checkpoint_last_error names the file and the cause ($last)"
tfail=$(stats 0 checkpoint_last_error_time)
fcmp "$tfail >= $t_start - 1 && $tfail <= $(date +%s) + 1"
ok $? "STATS checkpoint_last_error_time is the time of the failure ($tfail)"
m=$(metrics "$MPORT")
echo "$m" | grep -qx "psd_checkpoint_failures_total $fails" &&
    echo "$m" | grep -qx "psd_errors_total{code=\"checkpoint_write\"} $fails" &&
    echo "$m" | grep -qx "psd_aligned_checkpoint_version 0"
ok $? "/metrics: psd_checkpoint_failures_total $fails, in psd_errors_total, aligned version 0" ||
    echo "$m" | grep checkpoint | sed 's/^/# /'
lines=$(grep 'psd_checkpoint_write.c' "$T/psd0.log" | grep -c "checkpoint $FULL/0/a/psd-0-.* not written: .*No space left on device")
[ "$lines" -ge 1 ] && [ "$lines" -lt "$fails" ]
ok $? "the log names the file and the cause, rate-limited ($lines line(s) for $fails failures)"

"$PSCTL" --servers "$SERVERS" --server 0 checkpoint >"$T/ck.out" 2>&1
rc=$?
sed 's/^/# /' "$T/ck.out"
[ $rc != 0 ] && grep -q "not written: .*No space left on device" "$T/ck.out"
ok $? "psctl checkpoint: ERROR naming the cause, psctl exits $rc"
[ "$(stats 0 checkpoint_failures)" = $((fails + 1)) ] && [ "$(stats 0 checkpoint_version)" = -1 ]
ok $? "that failure is counted too, and STATS still reports no checkpoint"

kill -TERM "$PID_1"
wait_exit "$PID_1"
rc=$?
[ $rc = 1 ] && grep -q "final checkpoint not written: .*No space left on device" "$T/psd1.log"
ok $? "SIGTERM: psd 1 cannot write its final checkpoint, logs why and exits 1 (status $rc)"

rm -f "$FULL/0/fill"
"$PSCTL" --servers "$SERVERS" --server 0 checkpoint >"$T/ck2.out" 2>&1
ok $? "disk freed: psctl checkpoint succeeds" || sed 's/^/# /' "$T/ck2.out"
[ "$(stats 0 checkpoint_writes)" = 1 ] && [ "$(stats 0 checkpoint_version)" = 60 ] &&
    [ "$(stats 0 aligned_checkpoint_version)" = 60 ] && ls "$FULL"/0/a/psd-0-*.safetensors >/dev/null 2>&1
ok $? "STATS now reports the file written (version 60, aligned), and it exists"
[ ! -e "$FULL/0/a/psd-0.ckpt-failed" ] && grep -q "checkpoint writes succeed again" "$T/psd0.log"
ok $? "the failure note is removed and the log says writes succeed again"
"$PSCTL" --servers "$SERVERS" --server 0 shutdown >/dev/null 2>&1
wait_exit "$PID_0"
rc=$?
ok $rc "SHUTDOWN with a durable final checkpoint: exit 0 (status $rc)"
mkdir -p "$T/a"; mv "$T/psd0.log" "$T/a/psd0.log"; mv "$T/psd1.log" "$T/a/psd1.log"

# ---- 2. --shutdown-servers at the end of a job on a full disk ---------------
fill_disk b
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/0/b" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/1/b"
ok $? "2 psd started again on a full disk"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
run_workers 2 "$T/b" "${COMMON[@]}" --steps 30 --shutdown-servers
ok $? "--shutdown-servers: training succeeded, both workers exit 0"
wait_exit "$PID_0"; rc0=$?
wait_exit "$PID_1"; rc1=$?
[ $rc0 = 1 ] && [ $rc1 = 1 ]
ok $? "both psd stop although their final checkpoint failed, and exit 1 (status $rc0, $rc1)"
grep -q "final checkpoint not written" "$T/psd0.log" && grep -q "final checkpoint not written" "$T/psd1.log"
ok $? "both logs say the final checkpoint was not written"
mv "$T/psd0.log" "$T/b/psd0.log"; mv "$T/psd1.log" "$T/b/psd1.log"

# ---- 3. a server killed when it has no checkpoint ------------------------
fill_disk c
start_psd 0 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/0/c" &&
    start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/1/c"
ok $? "2 psd started for the kill"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
mkdir -p "$T/c"
wp=()
for r in 0 1; do
    timeout -k 2 50 "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 --out "$T/c" \
        --progress-every 0 --log-level warn "${COMMON[@]}" --steps 400 --step-sleep-ms 10 \
        >"$T/c/w$r.out" 2>"$T/c/w$r.err" &
    wp+=($!)
    PIDS+=($!)
done
for _ in $(seq 1 400); do
    f=$(stats 1 checkpoint_failures)
    [ -n "$f" ] && [ "$f" -ge 1 ] && break
    sleep 0.05
done
[ -n "$f" ] && [ "$f" -ge 1 ] && [ "$(csv_rows "$T/c/metrics-rank0.csv")" -lt 400 ]
ok $? "psd 1 failed an aligned checkpoint write mid-run"
kill -KILL "$PID_1"
wait "$PID_1" 2>/dev/null
PS_PORT=$PORT_1 start_psd 1 2 2 "${PSDF[@]}" --checkpoint-dir "$FULL/1/c"
ok $? "psd 1 SIGKILLed and restarted on port $PORT_1"
rc=0
for r in 0 1; do wait "${wp[$r]}" && rc=1; done
ok $rc "the job cannot go on: both workers fail"
grep -h 'ERROR' "$T/c/w0.err" | head -n 2 | sed 's/^/# /'
good=0
for r in 0 1; do
    grep -q "server 1 has no checkpoint of this job (its last write failed: .*No space left on device" \
        "$T/c/w$r.err" || good=1
done
ok $good "both workers' errors say server 1 has no checkpoint of this job and why"
! grep -q "no partition table" "$T/c/w0.err" "$T/c/w1.err"
ok $? "(not just that it has no partition table)"
grep -q "no usable checkpoint in $FULL/1/c (its last write failed" "$T/psd1.log"
ok $? "the restarted psd 1 logs that it found no usable checkpoint and why"
tap_done
