# shellcheck shell=bash
# Sourced after lib/integration_common.sh by the tests that kill processes
# of a running cluster at placed moments rather than timed ones, so what
# they check holds whatever the load (docs/reliability.md).

PSCTL=$top_builddir/psctl
[ -x "$PSCTL" ] || { echo "1..0 # SKIP $PSCTL not built"; exit 77; }

# fc_start_worker RANK SUFFIX OUTDIR [psworker flags...]: one psworker of
# $SERVERS with --num-workers ${FC_W:-2}, logs OUTDIR/wRANK{SUFFIX}.out/.err,
# bounded by timeout(1) ${WORKER_TIMEOUT:-80} s.  WPID = the timeout
# process (wait on it), WCHILD = the psworker (signal it).
fc_start_worker() {
    local r=$1 sfx=$2 out=$3; shift 3
    mkdir -p "$out"
    timeout -k 2 "${WORKER_TIMEOUT:-80}" "$PSW" --servers "$SERVERS" --rank "$r" \
        --num-workers "${FC_W:-2}" --out "$out" --progress-every 0 --log-level info "$@" \
        >"$out/w$r$sfx.out" 2>"$out/w$r$sfx.err" &
    WPID=$!
    PIDS+=($WPID)
    WCHILD=
    for _ in $(seq 1 1000); do # 10 s: timeout(1) forks late on a loaded machine
        WCHILD=$(pgrep -P "$WPID" | head -n 1)
        [ -n "$WCHILD" ] && break
        sleep 0.01
    done
}

# fc_stat ID KEY: a number from psd ID's STATS (empty when it does not answer).
fc_stat() {
    local port
    eval "port=\$PORT_$1"
    "$PSCTL" --servers "tcp://127.0.0.1:$port" --timeout-ms 5000 status --json 2>/dev/null |
        sed -n "s/^[[:space:]]*\"$2\":[[:space:]]*\([0-9]*\).*/\1/p" | head -n 1
}

# fc_wait_rows CSV N: wait until the metrics CSV has N rows (60 s at most);
# prints the count.
fc_wait_rows() {
    local seen=0
    for _ in $(seq 1 6000); do
        seen=$(csv_rows "$1")
        [ "$seen" -ge "$2" ] && break
        sleep 0.01
    done
    echo "$seen"
}

# fc_kill_psd_placed ID N PID...: SIGSTOP the workers PID...; SIGKILL psd
# ID once its STATS say an aligned checkpoint A >= N is durable and its
# partitions are past A but below A + N (else SIGCONT, a moment, and look
# again; 200 tries), so exactly the steps after A are lost and fewer than
# N.  With FC_PAST_CSV (a worker's metrics CSV) set, that worker must also
# have finished step A (more than A rows): it then pushes a step the
# restarted server has not reached, and the rollback is certain -- without
# it, workers that all wait on step A simply redo it (exact too, but not the
# path a test of rollback means to take).  Sets FC_A and FC_VMAX; returns 1
# when it found no such moment (the workers are then running).  On success the workers stay stopped: the
# caller restarts the psd and sends them SIGCONT.
fc_kill_psd_placed() {
    local id=$1 n=$2 pid; shift 2
    FC_A= FC_VMAX=
    for _ in $(seq 1 200); do
        kill -STOP "$@" 2>/dev/null
        FC_A=$(fc_stat "$id" aligned_checkpoint_version)
        FC_VMAX=$(fc_stat "$id" version_max)
        if [ -n "$FC_A" ] && [ -n "$FC_VMAX" ] && [ "$FC_A" -ge "$n" ] &&
            [ "$FC_VMAX" -gt "$FC_A" ] && [ "$FC_VMAX" -lt $((FC_A + n)) ] &&
            { [ -z "${FC_PAST_CSV:-}" ] || [ "$(csv_rows "$FC_PAST_CSV")" -gt "$FC_A" ]; }; then
            eval "pid=\$PID_$id"
            is_live "$pid" && kill -KILL "$pid"
            wait "$pid" 2>/dev/null
            return 0
        fi
        kill -CONT "$@" 2>/dev/null
        sleep 0.03
    done
    return 1
}

# fc_psd_lost_and_back ID N CKPTDIR PID...: fc_kill_psd_placed, then psd ID
# restarted on its port with "${PSDF[@]}" --checkpoint-dir CKPTDIR (as
# systemd would) and the workers PID... resumed.  Sets FC_A / FC_VMAX;
# returns 1 when the kill found no moment, 2 when the restart failed.
fc_psd_lost_and_back() {
    local id=$1 n=$2 dir=$3 port; shift 3
    fc_kill_psd_placed "$id" "$n" "$@" || return 1
    eval "port=\$PORT_$id"
    PS_PORT=$port start_psd "$id" 2 2 "${PSDF[@]}" --checkpoint-dir "$dir"
    local rc=$?
    kill -CONT "$@" 2>/dev/null
    [ $rc -eq 0 ] || return 2
}

# fc_died_mid_step WPID LOG: wait for a worker started with
# --debug-die-mid-step; 0 when it SIGKILLed itself there (exit 137, logged).
fc_died_mid_step() {
    { wait "$1"; } 2>/dev/null
    local rc=$?
    [ $rc -eq 137 ] && grep -q 'debug-die-mid-step' "$2"
}
