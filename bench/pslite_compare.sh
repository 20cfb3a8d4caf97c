#!/usr/bin/env bash
# psd against ps-lite (the parameter server of MXNet's kvstore) and against
# the floor of the same traffic over bare TCP, side by side in one run.
#
#   bench/pslite_compare.sh BUILDDIR [ROUNDS]     (run it alone on the machine)
#
# Needs ../shared/peers/pslite beside the repository (or PSLITE_PEER=DIR) (ps-lite's sources and
# its sync push+pull benchmark, bench_pp): without it the script says so and
# exits 77 -- a user's clone has no ../shared, and nothing of the product
# depends on it.  ps-lite is built into a temporary folder.
#
# Every cell (S servers x W workers, N bytes of fp32 gradient per worker,
# loopback) runs ps-lite's bench_pp, psbench (psd, fp32 wire, checksums as
# shipped, --check) and pp_floor (bare sockets, no server logic: push N
# then receive N), in an order that rotates each round; medians over ROUNDS
# (default 3) rounds of each one's median iteration, GB/s of gradient per
# worker.  CPU seconds per GB are summed over every process of the run
# (user + system, from the kernel's accounting of the finished processes).
# Then fp16 / bf16 / LZ4 wires are measured by psbench beside the fp32 cells.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
build=$(cd "${1:?usage: bench/pslite_compare.sh BUILDDIR [ROUNDS]}" && pwd)
rounds=${2:-3}
peer=${PSLITE_PEER:-$(cd "$top/.." && pwd)/shared/peers/pslite}
if [ ! -x "$peer/build.sh" ]; then
    echo "pslite_compare: no ps-lite peer at $peer (it is a benchmark peer beside the development"
    echo "checkout, not part of the project); nothing to compare against: skipped"
    exit 77
fi
for b in psbench psd bench/pp_floor; do
    [ -x "$build/$b" ] || { echo "pslite_compare: $build/$b missing: build the project first" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "pslite_compare: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pslite-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "# building ps-lite into $tmp/pslite ..."
"$peer/build.sh" "$tmp/pslite" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "# machine: $cpu; $(nproc) cores; $(uname -r); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# ps-lite at $(cd "$peer" && ls -d src >/dev/null && echo "$peer"), psd from $build; $rounds rounds"

# CELLS: "S W BYTES"
CELLS=("1 1 4194304" "2 1 4194304" "1 2 4194304" "2 2 4194304"
       "1 1 26214400" "2 1 26214400" "1 2 26214400" "2 2 26214400"
       "1 1 104857600" "2 2 104857600")
# a dry run of the script itself: PSLITE_CELLS="1 1 4194304;2 2 4194304" PSLITE_WIRES=0
[ -n "${PSLITE_CELLS:-}" ] && IFS=';' read -ra CELLS <<<"$PSLITE_CELLS"

T=(/usr/bin/time -a -f "cpu_s=%e_%U_%S")
# cpu_sum FILE: user + system seconds summed over the time(1) lines in FILE
cpu_sum() { sed -n 's/^cpu_s=[^_]*_\([^_]*\)_\(.*\)$/\1 \2/p' "$1" | awk '{ s += $1 + $2 } END { printf "%.3f", s }'; }
# per_gb CPU W N ITERS: CPU seconds per GB of gradient pushed by all W workers
per_gb() { awk -v c="$1" -v w="$2" -v n="$3" -v it="$4" 'BEGIN { printf "%.2f", c / (w * n * it / 1e9) }'; }

# Each runner prints "GBPS SERVER_CPU_PER_GB WORKER_CPU_PER_GB" (NA NA NA on failure).
# ps-lite: bench_pp's own warm-up (3) and timed iterations, plus one checking
# pull; its CPU is taken over the whole process lives (start-up included).
run_pslite() {
    local S=$1 W=$2 N=$3 port log=$tmp/pl pids=() wp=() rc=0
    rm -rf "$log"; mkdir -p "$log"; : >"$log/cpu_srv"; : >"$log/cpu_wrk"; : >"$log/cpu_sch"
    port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port DMLC_NUM_SERVER=$S DMLC_NUM_WORKER=$W \
           DMLC_NODE_HOST=127.0.0.1 DMLC_INTERFACE=lo
    (cd "$tmp/pslite" && DMLC_ROLE=scheduler timeout 120 "${T[@]}" -o "$log/cpu_sch" ./bench_pp --bytes "$N" \
        >"$log/sched" 2>&1) & pids+=($!)
    for i in $(seq 1 "$S"); do
        (cd "$tmp/pslite" && DMLC_ROLE=server timeout 120 "${T[@]}" -o "$log/cpu_srv" ./bench_pp --bytes "$N" \
            >"$log/server$i" 2>&1) & pids+=($!)
    done
    for i in $(seq 1 "$W"); do
        (cd "$tmp/pslite" && DMLC_ROLE=worker timeout 120 "${T[@]}" -o "$log/cpu_wrk" ./bench_pp --bytes "$N" \
            >"$log/worker$i" 2>&1) & wp+=($!)
    done
    for p in "${wp[@]}"; do wait "$p" || rc=1; done
    for p in "${pids[@]}"; do wait "$p" || true; done
    unset DMLC_PS_ROOT_URI DMLC_PS_ROOT_PORT DMLC_NUM_SERVER DMLC_NUM_WORKER DMLC_NODE_HOST DMLC_INTERFACE
    local line bad it
    line=$(grep -h '^pslite S=' "$log"/worker* | head -n 1)
    bad=$(grep -h 'check=' "$log"/worker* | grep -vc 'check=ok')
    if [ $rc -ne 0 ] || [ -z "$line" ] || [ "$bad" -ne 0 ]; then
        echo "pslite_compare: ps-lite $S x $W $N failed or its check failed:" >&2
        tail -n 5 "$log"/* >&2; echo "NA NA NA"; return
    fi
    it=$(( $(echo "$line" | sed -n 's/.* iters=\([0-9]*\).*/\1/p') + 4 ))
    echo "$(echo "$line" | sed -n 's/.*gbps=\([0-9.]*\).*/\1/p')" \
         "$(per_gb "$(cpu_sum "$log/cpu_srv")" "$W" "$N" "$it")" \
         "$(per_gb "$(awk -v a="$(cpu_sum "$log/cpu_wrk")" -v b="$(cpu_sum "$log/cpu_sch")" 'BEGIN { print a + b }')" "$W" "$N" "$it")"
}

# psd: psbench measures psd's and the workers' CPU over its timed iterations.
run_psbench() {
    local S=$1 W=$2 N=$3 out; shift 3
    out=$(timeout 300 "$build/psbench" --psd "$build/psd" --servers "$S" --workers "$W" --bytes "$N" \
          --iters 40 --check --pump-seconds 0 "$@" 2>"$tmp/psbench.err" | tail -n 1)
    if ! echo "$out" | grep -q 'check=ok'; then
        echo "pslite_compare: psbench $S x $W $N $* failed or its check failed:" >&2
        tail -n 5 "$tmp/psbench.err" >&2; echo "$out" >&2; echo "NA NA NA"; return
    fi
    echo "$(echo "$out" | sed -n 's/.*gbps_per_worker=\([0-9.]*\).*/\1/p')" \
         "$(echo "$out" | sed -n 's/.*cpu_psd_s_per_gb=\([0-9.]*\).*/\1/p')" \
         "$(echo "$out" | sed -n 's/.*cpu_worker_s_per_gb=\([0-9.]*\).*/\1/p')"
}

# the floor: every process's CPU over its whole life (pp_floor's children)
run_floor() {
    local S=$1 W=$2 N=$3 out
    : >"$tmp/flcpu"
    out=$("${T[@]}" -o "$tmp/flcpu" timeout 120 "$build/bench/pp_floor" --servers "$S" --workers "$W" \
          --bytes "$N" --iters 40) || { echo "NA NA NA"; return; }
    echo "$(echo "$out" | sed -n 's/.*gbps=\([0-9.]*\).*/\1/p') $(per_gb "$(cpu_sum "$tmp/flcpu")" "$W" "$N" 43) -"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0 || v[1] == "NA") print "NA"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A G CS CW
kinds=(pslite psbench floor)
for r in $(seq 1 "$rounds"); do
    ci=0
    for cell in "${CELLS[@]}"; do
        set -- $cell
        for k in 0 1 2; do
            kind=${kinds[$(( (k + r + ci) % 3 ))]}
            read -r g cs cw < <(run_$kind "$1" "$2" "$3")
            G[$kind,$cell]+="$g "
            CS[$kind,$cell]+="$cs "
            CW[$kind,$cell]+="$cw "
        done
        ci=$((ci + 1))
        echo "# round $r: $1 x $2 $(( $3 >> 20 )) MiB done"
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NA" || b == "NA" || b == 0) print "NA"; else printf "%.2f", a / b }'; }
echo
echo "| S x W | size | psd (ours) | ps-lite | floor | ours / ps-lite | ours / floor | CPU s/GB: psd | ours' workers | ps-lite servers | ps-lite workers | floor (all) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
med() { echo $1 | tr ' ' '\n' | median; }
for cell in "${CELLS[@]}"; do
    set -- $cell
    o=$(med "${G[psbench,$cell]}"); p=$(med "${G[pslite,$cell]}"); f=$(med "${G[floor,$cell]}")
    echo "| $1 x $2 | $(( $3 >> 20 )) MiB | $o | $p | $f | $(ratio "$o" "$p") | $(ratio "$o" "$f") |" \
         "$(med "${CS[psbench,$cell]}") | $(med "${CW[psbench,$cell]}") | $(med "${CS[pslite,$cell]}") |" \
         "$(med "${CW[pslite,$cell]}") | $(med "${CS[floor,$cell]}") |"
done
echo "(GB/s of fp32 gradient per worker = N / median iteration; CPU seconds per GB of gradient pushed by"
echo " all workers, user + system; ps-lite's workers include its scheduler)"

[ "${PSLITE_WIRES:-1}" = 0 ] && exit 0
echo
echo "# other wires (psbench alone; GB/s of fp32 gradient per worker, medians of $rounds rounds)"
echo "| S x W | size | wire | psd (ours) | fp32 ours (above) |"
echo "|---|---|---|---|---|"
for cell in "1 1 26214400" "2 2 26214400"; do
    set -- $cell
    for wire in "--dtype fp16" "--dtype bf16" "--codec lz4" "--dtype fp16 --codec lz4"; do
        vals=""
        for r in $(seq 1 "$rounds"); do
            read -r g _ < <(run_psbench "$1" "$2" "$3" $wire); vals+="$g "
        done
        o=$(echo $vals | tr ' ' '\n' | median)
        f32=$(med "${G[psbench,$cell]}")
        echo "| $1 x $2 | $(( $3 >> 20 )) MiB | ${wire//--/} | $o | $f32 |"
    done
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
