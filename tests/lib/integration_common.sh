# shellcheck shell=bash
# Sourced by tests/test_integration_*.sh: start psd servers and psworker
# processes on loopback with free ports, compare model files, print TAP.
# Every process started here is killed (by pid) when the test exits.

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
PSD=$top_builddir/psd
PSW=$top_builddir/psworker
STC=$top_builddir/tests/tools/st_compare
for b in "$PSD" "$PSW" "$STC"; do
    [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done

T=$(mktemp -d "${TMPDIR:-/tmp}/ps-integ.XXXXXX")
PIDS=()
tap_n=0
tap_fail=0

. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"
it_cleanup() {
    # give each process a moment to checkpoint and exit, then insist
    stop_pids 10
    if [ "$tap_fail" -gt 0 ] || [ -n "${KEEP_TMP:-}" ]; then
        echo "# logs kept in $T"
    else
        rm -rf "$T"
    fi
}
trap it_cleanup EXIT
trap 'exit 130' INT TERM

ok() {  # ok COND-EXIT-STATUS DESCRIPTION
    tap_n=$((tap_n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $tap_n - $2"; else echo "not ok $tap_n - $2"; tap_fail=$((tap_fail + 1)); fi
}
diag() { echo "# $*"; }
tap_done() { echo "1..$tap_n"; [ "$tap_fail" -eq 0 ]; exit $?; }
# Show the end of a log file as TAP comments (on failure).
# await_exit SECS PID...: wait for processes told to exit (a shutdown); one
# still running after SECS seconds is named, stopped, and the call fails --
# a shutdown that never came must fail the test, not hang it
await_exit() {
    local secs=$1 p rc=0
    shift
    for p in "$@"; do
        for _ in $(seq 1 $((secs * 10))); do is_live "$p" || break; sleep 0.1; done
        if is_live "$p"; then
            diag "still running ${secs}s after its shutdown, stopped: pid $p: $(ps -o args= -p "$p" | cut -c1-100)"
            kill -TERM "$p" 2>/dev/null
            rc=1
        fi
        reap_pid "$p" 20
    done
    return $rc
}
show_log() { [ -f "$1" ] && { echo "# --- $1"; tail -n "${2:-15}" "$1" | sed 's/^/#   /'; }; }

# start_psd ID NSERVERS NWORKERS [extra psd flags...]: sets PORT_<ID>, PID_<ID>.
# With PS_PORT=N in the environment the port is fixed (restart case).
start_psd() {
    local id=$1 ns=$2 nw=$3; shift 3
    local pf=$T/psd$id.port port=${PS_PORT:-0}
    rm -f "$pf"
    # PSD_PRELOAD: preloaded into psd alone, not into the commands below
    local pre=()
    [ -n "${PSD_PRELOAD:-}" ] && pre=(env "LD_PRELOAD=$PSD_PRELOAD")
    "${pre[@]}" "$PSD" --port "$port" --port-file "$pf" --server-id "$id" --num-servers "$ns" \
        --num-workers "$nw" --log-level "${PSD_LOG:-info}" "$@" >>"$T/psd$id.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    eval "PID_$id=$pid"
    for _ in $(seq 1 200); do
        if [ -s "$pf" ]; then eval "PORT_$id=$(tr -dc 0-9 <"$pf")"; return 0; fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "# psd $id did not start (no port file $pf)"
    show_log "$T/psd$id.log"
    return 1
}

# start_cluster NSERVERS NWORKERS [psd flags...]: sets SERVERS.
start_cluster() {
    local ns=$1 nw=$2 i; shift 2
    SERVERS=
    for ((i = 0; i < ns; i++)); do
        start_psd "$i" "$ns" "$nw" "$@" || return 1
        eval "SERVERS=\${SERVERS:+\$SERVERS,}tcp://127.0.0.1:\$PORT_$i"
    done
}

# run_workers NWORKERS OUTDIR [psworker flags...]: runs all ranks, waits
# (each bounded by WORKER_TIMEOUT seconds); returns non-zero if any failed.
# The ranks use the servers in $SERVERS, or with RING_PEERS set (run_ring)
# form that ring instead (--mode allreduce).
run_workers() {
    local nw=$1 out=$2 r rc=0; shift 2
    local wp=() conn=(--servers "$SERVERS")
    [ -n "${RING_PEERS:-}" ] && conn=(--mode allreduce --peers "$RING_PEERS")
    mkdir -p "$out"
    for ((r = 0; r < nw; r++)); do
        timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" "${conn[@]}" --rank "$r" \
            --num-workers "$nw" --out "$out" --progress-every 0 --log-level warn "$@" \
            >"$out/w$r.out" 2>"$out/w$r.err" &
        wp+=($!)
        PIDS+=($!)
    done
    for ((r = 0; r < nw; r++)); do
        if ! wait "${wp[$r]}"; then
            rc=1
            echo "# worker $r failed"
            show_log "$out/w$r.err"
        fi
    done
    return $rc
}

# csv_rows FILE: data rows of a metrics CSV (0 if it does not exist yet).
csv_rows() {
    local n
    n=$( { wc -l <"$1"; } 2>/dev/null) || n=1
    echo $((n > 0 ? n - 1 : 0))
}

# overlapped NAME: --overlap really overlapped in $T/NAME/w0.err: the
# closing count shows pushes handed off during backward and replies
# awaited by the next forward's layers (both > 0)
overlapped() {
    local line early fwd
    line=$(grep -h -- '--overlap: .* handed off during backward' "$T/$1/w0.err" | tail -n 1)
    early=$(sed -n 's/.*overlap: \([0-9]*\) of [0-9]* partition pushes.*/\1/p' <<<"$line")
    fwd=$(sed -n 's/.*backward, \([0-9]*\) of [0-9]* replies.*/\1/p' <<<"$line")
    [ -n "$early" ] && [ "$early" -gt 0 ] && [ -n "$fwd" ] && [ "$fwd" -gt 0 ]
    ok $? "$1 overlapped: ${line#*overlap: }"
}

# final_value FILE KEY: a key=value from the "final:" line.
final_value() {
    grep '^final:' "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# standalone OUTDIR [psworker flags...]
standalone() {
    local out=$1; shift
    mkdir -p "$out"
    timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" --standalone --out "$out" --progress-every 0 \
        --log-level warn "$@" >"$out/w0.out" 2>"$out/w0.err" || { show_log "$out/w0.err"; return 1; }
}

# compare A REF TOL [FLOOR [st_compare flags...]]: st_compare, printing its
# summary as a comment (FLOOR "" = none).
compare() {
    local out rc a=$1 b=$2 tol=$3 fl=${4:-}
    shift 3; [ $# -gt 0 ] && shift
    out=$("$STC" "$a" "$b" --tol "$tol" ${fl:+--floor "$fl"} "$@" 2>&1)
    rc=$?
    echo "$out" | sed 's/^/# /'
    return $rc
}

# Compare floats: fcmp "A < B" (awk expression on numbers).
fcmp() { awk "BEGIN { exit !($*) }"; }

# free_ports N: N loopback TCP ports nobody listens on right now.
free_ports() {
    local py
    for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1; then
            "$py" -c 'import socket,sys
ss=[socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1",0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
            return
        fi
    done
    local i out=
    for ((i = 0; i < $1; i++)); do out="$out${out:+ }$((20000 + (RANDOM * 7 + $$ + i * 13) % 30000))"; done
    echo "$out"
}
# peers_of N: tcp://127.0.0.1:p,... for a ring of N ranks on free ports.
peers_of() {
    local p out=
    for p in $(free_ports "$1"); do out=${out:+$out,}tcp://127.0.0.1:$p; done
    echo "$out"
}

# cuda_vs_cpu NO_GPU_RCS [psworker flags...]: a 3-step standalone run on
# --device cuda:0 into $T/gpu.  With a GPU its weights must equal $T/cpu's
# (the same run on the CPU, done by the caller) within 2e-3 of each
# tensor's scale; without one it must exit with one of NO_GPU_RCS (e.g.
# "2" or "1 2"), name --device cuda:0 and the cause, and not crash.
cuda_vs_cpu() {
    local want=$1 rc l; shift
    timeout 50 "$PSW" --standalone "$@" --device cuda:0 --out "$T/gpu" --progress-every 0 \
        >"$T/gpu.out" 2>"$T/gpu.err"
    rc=$?
    if [ $rc = 0 ]; then
        diag "a GPU is present: comparing the CUDA run with the CPU run"
        l=$(final_value "$T/gpu.out" loss)
        [ -n "$l" ] && [ "$l" != nan ]
        ok $? "cuda:0 trained 3 steps (loss $l)"
        compare "$T/gpu/model.safetensors" "$T/cpu/model.safetensors" 2e-3
        ok $? "cuda:0 weights == cpu weights within 2e-3 of each tensor's scale"
    else
        [[ " $want " == *" $rc "* ]]
        ok $? "no GPU: --device cuda:0 exits $rc (allowed: $want; not a crash)" || show_log "$T/gpu.err"
        grep -q -- "--device cuda:0" "$T/gpu.err" && grep -qiE "CUDA device|without CUDA|cannot use" "$T/gpu.err"
        ok $? "no GPU: the message names --device cuda:0 and the cause" || show_log "$T/gpu.err"
        ! grep -qiE "segmentation|core dumped|abort" "$T/gpu.err"
        ok $? "no GPU: no crash report in the log"
    fi
}

# psd_vs_standalone STEPS WHAT [psworker flags...]: stop the running
# cluster, start 2 psd for ONE worker (sync), train STEPS steps of batch 4
# through them into $T/one and the same run standalone into $T/ref; the
# weights must agree within 1e-5 (fp32 wire: psd applies the same update).
psd_vs_standalone() {
    local steps=$1 what=$2 p; shift 2
    for p in $(live_pids); do kill -TERM "$p" 2>/dev/null; done
    start_cluster 2 1 --mode sync
    ok $? "2 psd for one worker"
    run_workers 1 "$T/one" "$@" --batch 4 --steps "$steps" --partition-bytes 65536
    ok $? "1 worker, $steps steps through psd"
    standalone "$T/ref" "$@" --batch 4 --steps "$steps" --partition-bytes 65536
    ok $? "standalone, $steps steps"
    compare "$T/one/model.safetensors" "$T/ref/model.safetensors" 1e-5
    ok $? "psd-trained $what == standalone within 1e-5"
}

# eval_equals OUT LABEL KEYS [psworker flags...]: psworker --eval of the
# export beside the training output OUT (its directory's model.safetensors;
# the flags name the model and the validation set) prints the same value
# for each of KEYS (words) as OUT's final line; its output in OUT.eval
BOX_KEYS="detections map ap50 ap75"
eval_equals() {
    local run=$1 label=$2 keys=$3 k a b
    shift 3
    timeout 50 "$PSW" --eval "$@" --weights "$(dirname "$run")/model.safetensors" \
        --log-level warn >"$run.eval" 2>"$run.eval.err"
    ok $? "psworker --eval on the exported $label"
    for k in $keys; do
        a=$(final_value "$run" "$k"); b=$(final_value "$run.eval" "$k")
        [ -n "$a" ] && [ "$a" = "$b" ]
        ok $? "$label: --eval $k=$b equals the final $k=$a"
    done
}

# train_json NAME STEPS [psworker flags...]: psworker --standalone --batch 4
# --steps STEPS with the flags (a model and a --train-json to try), under a
# 30 s timeout; its output in $T/NAME.out and $T/NAME.err, its exit status
# in $rc, its final loss in $loss.  finite VALUE: a number, not NaN.
train_json() {
    local name=$1 steps=$2
    shift 2
    timeout 30 "$PSW" --standalone "$@" --batch 4 --steps "$steps" >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
    loss=$(final_value "$T/$name.out" loss)
}
finite() { [ -n "$1" ] && [ "$1" != nan ] && [ "$1" != -nan ]; }

# Dynamic loss scaling, independently of psworker (the loss-scale tests of
# PS and ring mode): ls_policy STEPS K WIN INIT prints "step old new" for
# every change of the scale when step K overflows -- start INIT, x2 after
# WIN clean steps in a row, /2 on overflow (clean count reset).
ls_policy() {
    awk -v n="$1" -v k="$2" -v w="$3" -v s="$4" 'BEGIN {
    c = 0
    for (i = 0; i < n; i++) {
        if (i == k) { printf "%d %d %d\n", i, s, s / 2; s /= 2; c = 0; continue }
        if (++c >= w) { printf "%d %d %d\n", i, s, s * 2; s *= 2; c = 0 }
    } }'
}
# ls_seq_of LOG: the same "step old new" lines from a psworker's log.
ls_seq_of() { sed -n 's/.*loss scale: step \([0-9]*\) .*scale \([0-9]*\) -> \([0-9]*\).*/\1 \2 \3/p' "$1"; }
