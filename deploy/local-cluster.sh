#!/usr/bin/env bash
# Run the main job on this machine: build if needed, start S psd servers and
# W psworker processes on loopback (free ports), train (sync SGD; the smoke
# model until TSM lands), stream rank 0's progress and print a summary.
# Everything started here is stopped on exit or Ctrl-C.
#
# usage: ./deploy/local-cluster.sh [--steps N] [--workers N] [--servers N]
#            [--dtype fp32|fp16|bf16] [--batch N] [--mode sync|async|ssp]
#            [--] [extra psworker flags, e.g. --lr 0.1 --codec lz4]
# Environment: PS_BIN_DIR=DIR  use psd/psworker already built in DIR (no build)
#              PS_RUN_ROOT=DIR where run directories go (default ./run)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SRC=$(pwd)

STEPS=300 WORKERS=2 SERVERS_N=2 DTYPE=fp32 BATCH=32 MODE=sync
EXTRA=()
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --steps) STEPS=${2:?--steps needs a value}; shift 2 ;;
    --workers) WORKERS=${2:?--workers needs a value}; shift 2 ;;
    --servers) SERVERS_N=${2:?--servers needs a value}; shift 2 ;;
    --dtype) DTYPE=${2:?--dtype needs a value}; shift 2 ;;
    --batch) BATCH=${2:?--batch needs a value}; shift 2 ;;
    --mode) MODE=${2:?--mode needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA+=("$@"); break ;;
    *) EXTRA+=("$1"); shift ;;
    esac
done
for v in STEPS WORKERS SERVERS_N BATCH; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "local-cluster: ${v,,} must be a positive integer (got '${!v}')" >&2; exit 2; }
done
[ "$WORKERS" -le 64 ] && [ "$SERVERS_N" -le 64 ] ||
    { echo "local-cluster: at most 64 workers and 64 servers on one machine" >&2; exit 2; }

# ---- build (or use prebuilt binaries) ----------------------------------------
if [ -n "${PS_BIN_DIR:-}" ]; then
    BIN=$PS_BIN_DIR
else
    . deploy/deps.sh
    ps_ensure_packages
    BIN=$SRC
    if [ ! -x "$BIN/psd" ] || [ ! -x "$BIN/psworker" ] || [ -n "$(find common server worker proto configure.ac Makefile.am -newer "$BIN/psworker" -print -quit 2>/dev/null)" ]; then
        echo "building (log: build.log) ..."
        if ! (PS_MAKE_TARGETS="psd psworker" ps_build) >build.log 2>&1; then
            tail -n 30 build.log >&2
            echo "local-cluster: build failed; full log in $SRC/build.log" >&2
            exit 1
        fi
    fi
fi
for b in psd psworker; do
    [ -x "$BIN/$b" ] || { echo "local-cluster: $BIN/$b not found or not executable" >&2; exit 1; }
done

RUN=${PS_RUN_ROOT:-$SRC/run}/local-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$RUN" || { echo "local-cluster: cannot create $RUN" >&2; exit 1; }

# ---- process bookkeeping -------------------------------------------------------
PSD_PIDS=() WORKER_PIDS=() TAIL_PID=
cleanup() {
    local p
    trap - EXIT INT TERM
    [ -n "$TAIL_PID" ] && kill "$TAIL_PID" 2>/dev/null
    for p in "${WORKER_PIDS[@]}" "${PSD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${WORKER_PIDS[@]}" "${PSD_PIDS[@]}"; do
        for _ in $(seq 1 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    [ -n "$TAIL_PID" ] && wait "$TAIL_PID" 2>/dev/null
}
trap cleanup EXIT
trap 'echo; echo "interrupted: stopping all processes (logs in $RUN)"; exit 130' INT TERM
die() {
    echo "local-cluster: $*" >&2
    echo "logs: $RUN" >&2
    exit 1
}

# ---- servers --------------------------------------------------------------------
SERVERS=
for ((i = 0; i < SERVERS_N; i++)); do
    "$BIN/psd" --port 0 --port-file "$RUN/psd$i.port" --server-id $i --num-servers "$SERVERS_N" \
        --num-workers "$WORKERS" --mode "$MODE" --checkpoint-dir "$RUN/ckpt$i" >"$RUN/psd$i.log" 2>&1 &
    PSD_PIDS+=($!)
    for _ in $(seq 1 100); do
        [ -s "$RUN/psd$i.port" ] && break
        kill -0 "${PSD_PIDS[$i]}" 2>/dev/null || { tail -n 20 "$RUN/psd$i.log" >&2; die "psd $i failed to start"; }
        sleep 0.1
    done
    [ -s "$RUN/psd$i.port" ] || die "psd $i did not report its port within 10 s"
    SERVERS=${SERVERS:+$SERVERS,}tcp://127.0.0.1:$(tr -dc 0-9 <"$RUN/psd$i.port")
done
echo "servers: $SERVERS"

# ---- workers --------------------------------------------------------------------
EVERY=$((STEPS / 10 > 0 ? STEPS / 10 : 1))
# The smoke model is 9.5 KB: small partitions so that every server owns some
# (psworker flags given after the options override this).
PART_BYTES=2048
# create the logs here: the watchers below read them before a worker may have
for ((r = 0; r < WORKERS; r++)); do : >"$RUN/worker$r.log"; done
for ((r = 0; r < WORKERS; r++)); do
    last=()
    [ $r = 0 ] && last=(--shutdown-servers)
    "$BIN/psworker" --servers "$SERVERS" --rank $r --num-workers "$WORKERS" --mode "$MODE" \
        --model smoke --steps "$STEPS" --batch "$BATCH" --dtype "$DTYPE" --out "$RUN" \
        --partition-bytes "$PART_BYTES" \
        --progress-every $EVERY "${last[@]}" "${EXTRA[@]}" \
        >"$RUN/worker$r.log" 2>&1 &
    WORKER_PIDS+=($!)
done
echo "$WORKERS workers, $STEPS steps, batch $BATCH per worker, wire $DTYPE, mode $MODE; run dir $RUN"
# stream rank 0's progress; tail ends by itself when rank 0 exits
tail -s 0.2 --pid="${WORKER_PIDS[0]}" -n +1 -f "$RUN/worker0.log" 2>/dev/null |
    grep --line-buffered -E '^(iter|final:)|ERROR' &
TAIL_PID=$!

# ---- watch: every worker must finish; a dying server is an error --------------
declare -A done_rc=()
while [ ${#done_rc[@]} -lt "$WORKERS" ]; do
    for ((r = 0; r < WORKERS; r++)); do
        [ -n "${done_rc[$r]:-}" ] && continue
        if ! kill -0 "${WORKER_PIDS[$r]}" 2>/dev/null; then
            wait "${WORKER_PIDS[$r]}"
            done_rc[$r]=$?
            if [ "${done_rc[$r]}" != 0 ]; then
                tail -n 15 "$RUN/worker$r.log" >&2
                die "worker $r exited with status ${done_rc[$r]} (log: $RUN/worker$r.log)"
            fi
        fi
    done
    # (once rank 0 printed its result it shuts the servers down itself)
    if [ ${#done_rc[@]} -lt "$WORKERS" ] && ! grep -q '^final:' "$RUN/worker0.log"; then
        for ((i = 0; i < SERVERS_N; i++)); do
            if ! kill -0 "${PSD_PIDS[$i]}" 2>/dev/null; then
                tail -n 15 "$RUN/psd$i.log" >&2
                die "psd $i died while training (log: $RUN/psd$i.log)"
            fi
        done
    fi
    sleep 0.2
done
wait "$TAIL_PID" 2>/dev/null
TAIL_PID=

# ---- summary --------------------------------------------------------------------
val() { grep '^final:' "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }
total_sps=0
for ((r = 0; r < WORKERS; r++)); do
    total_sps=$(awk -v a="$total_sps" -v b="$(val "$RUN/worker$r.log" samples_per_s)" 'BEGIN { printf "%.1f", a + b }')
done
cat <<SUMMARY

==== summary ====
steps:            $(val "$RUN/worker0.log" steps) (sync SGD, $WORKERS workers x batch $BATCH, $SERVERS_N servers, wire $DTYPE)
train loss:       $(val "$RUN/worker0.log" loss) (rank 0, mean of the last 10 steps)
eval loss:        $(val "$RUN/worker0.log" init_eval_loss) -> $(val "$RUN/worker0.log" eval_loss) (held-out accuracy $(val "$RUN/worker0.log" accuracy))
throughput:       $total_sps samples/s (all workers); rank 0 step $(val "$RUN/worker0.log" step_ms) ms = compute $(val "$RUN/worker0.log" compute_ms) ms + comm wait $(val "$RUN/worker0.log" comm_wait_ms) ms
model:            $RUN/model.safetensors
metrics (CSV):    $RUN/metrics-rank*.csv
logs:             $RUN/psd*.log $RUN/worker*.log
checkpoints:      $RUN/ckpt*/
SUMMARY
