#!/bin/sh
# The scaling study in one command: builds an emulated 25 GbE
# cluster (deploy/netns, tc tbf), sweeps parameter-server mode (1/2/4
# servers) and ring mode over 1..16 workers, fp32/fp16/top-k on the wire,
# overlap on/off, with a model's real partition layout and its compute
# emulated by a sleep (psbench), then fits the alpha-beta cost model, draws
# the plots and regenerates the tables of docs/scaling.md.  Needs root.
# Run it ALONE on the machine: the emulation is only right while the CPUs
# keep up with the links.
#
#   bench/scaling/scaling.sh [--quick | --full] [options]
#     --quick              46 points, about 14 minutes alone (default; 809 s
#                          on 2026-11-30)
#     --full               every combination (~1.5 hours)
#     --models             the model comparison: co-located PS (S = W, 1 MiB
#                          partitions) and the ring, fp16, overlap on, at
#                          W = 1, 2, 4, 8, 16 (10 points; the CSV only, no
#                          fit: bench/video_study.sh runs it per model)
#     --build DIR          where psbench and psd are (default: .)
#     --results DIR        CSV + PNG (default: bench/scaling/results in the source tree)
#     --docs FILE          markdown whose generated tables are replaced
#                          (default docs/scaling.md; --docs none = leave it)
#     --label TEXT         put in the docs ("alone", "under load", ...; default alone)
#     --model M            tsm-r50 (default) | tsm-r18 | i3d-r50-311 | i3d-r50-333 | retinanet-r50
#     --scale F            slow-down factor (default 50, see below)
#     --gpu-step-ms T      compute of one step on the real GPU (default 53; the
#                          I3D models: 53 x their training FLOPs per clip at
#                          32 x 224^2 over TSM-R50's at 8 x 224^2, 3.47x /
#                          4.20x, bench/video_cost)
#     --iters K --warmup K timed / untimed steps per point (default 2 / 1 quick, 4 / 1 full)
#     --dry-run            print the psbench commands, run nothing
#
# Scaling rule.  The cluster emulated: V100-class workers, one 25 GbE link
# each.  Two cores cannot move 16 x 25 Gb/s, so every link runs at
# 25 Gb/s / F and every step's compute takes T * F: communication and
# compute both take F times longer, so their ratio -- what scaling
# efficiency depends on -- is the real cluster's, as long as the
# per-message CPU costs (encode, sum, kernel) stay small against the slowed
# transfers.  F = 50: 500 Mbit/s per link; at most ~1 GB/s crosses the
# bridge (16 ring links), which two cores forward.  Latency is not scaled
# (the bridge's ~0.1 ms stands in for a switch's).
#
# T = 53 ms: one TSM-ResNet-50 step of 8 clips x 8 frames (64 frames at
# 224^2) in mixed precision on a V100.  TSM's shift adds no FLOPs, so the
# frames cost what ResNet-50 images cost; NVIDIA DeepLearningExamples
# (PyTorch ResNet-50 v1.5, DGX-1 V100 16GB, 1 GPU) measures 1200 img/s mixed
# precision: 64 / 1200 = 53 ms (FP32 367 img/s: 174 ms).
#
# Compute schedule: psbench splits the emulated forward (1/3) and backward
# (2/3) over the partitions by the forward MACs of their layers at 224^2
# (worker/models/model_sizes.h), not by their sizes.  Placement: dedicated = S
# server hosts + W worker hosts; colocated = server s on worker s's host
# (W hosts).  Before the sweep, what one link really carries (TCP through
# tbf, 1 and 8 streams) is measured and written beside the nominal rate.
#
# Step split: data wait is 0 here (no data loader: the paper's third
# bottleneck is measured by psworker on real video, its CSV data_wait_ms);
# compute = the emulated forward+backward; comm wait = the rest.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
nd=$src/deploy/netns
build=. results=$src/bench/scaling/results docs=$src/docs/scaling.md label=alone
model=tsm-r50 scale=50 gpu_ms= iters= warmup=1 dry=0 quick=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1; shift ;;
    --full) quick=0; shift ;;
    --models) quick=2; shift ;;
    --build) build=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --docs) docs=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --gpu-step-ms) gpu_ms=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "scaling.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$iters" ] || { [ $quick = 0 ] && iters=4 || iters=2; }
# the compute of a step on a V100-class GPU, by the FLOPs of the paper's clip
[ -n "$gpu_ms" ] || gpu_ms=$(awk -v m="$model" 'BEGIN { r["i3d-r50-311"] = 227.26 / 65.41
    r["i3d-r50-333"] = 274.94 / 65.41; printf "%.1f", 53 * (m in r ? r[m] : 1) }')
for v in "$scale" "$gpu_ms" "$iters" "$warmup"; do
    echo "$v" | grep -Eq '^[0-9]+(\.[0-9]+)?$' || { echo "scaling.sh: '$v' is not a number" >&2; exit 2; }
done
psbench=$build/psbench psd=$build/psd
[ -x "$psbench" ] && [ -x "$psd" ] || { echo "scaling.sh: no psbench/psd in $build (--build DIR)" >&2; exit 2; }
psbench=$(cd "$(dirname "$psbench")" && pwd)/psbench psd=$(cd "$(dirname "$psd")" && pwd)/psd
mbit=$(awk -v f="$scale" 'BEGIN { printf "%d", 25000 / f }')
compute_ms=$(awk -v t="$gpu_ms" -v f="$scale" 'BEGIN { printf "%g", t * f }')
"$psbench" --model "$model" --help >/dev/null 2>&1 || { echo "scaling.sh: psbench does not know --model $model" >&2; exit 2; }

# The points: "mode servers workers dtype codec overlap [placement
# partition_bytes pull_credit]" per line (defaults: dedicated 4M 0).
# overlap: off | on (pushes during the backward) | fwd (and the next
# forward waits per partition); pull_credit > 0: PUSH + PULL with that many
# pulls per server outstanding, front of the model first (psbench --help).
points() {
    if [ $quick = 2 ]; then
        for w in 1 2 4 8 16; do echo "ps $w $w fp16 raw on colocated 1M"; echo "ring 0 $w fp16 raw on"; done
        return
    fi
    if [ $quick = 1 ]; then
        for w in 1 2 4 8 16; do echo "ps 4 $w fp16 raw on"; done
        for w in 1 2 4 8 16; do echo "ring 0 $w fp16 raw on"; done
        # what closes the gap at 8 workers, one change at a time
        echo "ps 4 8 fp16 raw fwd"; echo "ps 4 8 fp16 raw fwd dedicated 1M"
        echo "ps 4 8 fp16 raw fwd dedicated 1M 2"
        echo "ps 8 8 fp16 raw fwd"; echo "ps 8 8 fp16 raw fwd colocated"
        echo "ps 8 8 fp16 raw on colocated 1M"; echo "ps 8 8 fp16 raw fwd colocated 1M"
        echo "ps 16 16 fp16 raw on colocated 1M"
        echo "ps 4 8 fp32 raw on"; echo "ps 4 8 fp32 topk on"
        echo "ps 4 8 fp16 raw off"; echo "ring 0 8 fp16 raw off"; echo "ps 4 1 fp16 raw off"
        # the number of servers (1, 2, 4 dedicated) at 4 and 8 workers, and
        # both wires of the ring beside "ps 4 8 fp32 raw on"
        echo "ps 1 1 fp16 raw on"; echo "ps 1 4 fp16 raw on"; echo "ps 1 8 fp16 raw on"
        echo "ps 2 4 fp16 raw on"; echo "ps 2 8 fp16 raw on"; echo "ring 0 8 fp32 raw on"
        # co-located servers (S = W, 1 MiB) below 8 workers: the points the
        # cost model's co-located fit needs besides W = 8 and 16
        echo "ps 2 2 fp16 raw on colocated 1M"; echo "ps 4 4 fp16 raw on colocated 1M"
        echo "ps 16 16 fp16 raw fwd colocated 1M"
        # the other wires and overlap off against the number of workers
        # (4 dedicated servers and the ring; W = 8 is above)
        for w in 1 4 16; do
            echo "ps 4 $w fp32 raw on"; echo "ring 0 $w fp32 raw on"; echo "ps 4 $w fp32 topk on"
            echo "ring 0 $w fp16 raw off"
            [ $w = 1 ] || echo "ps 4 $w fp16 raw off"
        done
        return
    fi
    for o in on off; do
        for w in 1 2 4 8 16; do
            for s in 1 2 4; do
                for f in "fp32 raw" "fp16 raw" "fp32 topk"; do echo "ps $s $w $f $o"; done
            done
            for f in "fp32 raw" "fp16 raw"; do echo "ring 0 $w $f $o"; done
        done
    done
}
# hosts: dedicated S + W, colocated W, ring W
hosts=$(points | awk '{ h = $7 == "colocated" ? $3 : $2 + $3; if (h > m) m = h } END { print m }')
prefix=pssc$$
mkdir -p "$results"
csv=$results/scaling-$model.csv
echo "# scaling: $(case $quick in 1) echo quick ;; 2) echo models ;; *) echo full ;; esac) model=$model link=${mbit}mbit (25 Gbit/s / $scale)" \
    "compute_ms=$compute_ms (${gpu_ms} ms x $scale) hosts=$hosts iters=$iters warmup=$warmup -> $csv"
t_start=$(date +%s)
if [ $dry = 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "scaling.sh: needs root (network namespaces)" >&2; exit 3; }
    trap '"$nd/down.sh" $prefix >/dev/null 2>&1' EXIT
    trap 'exit 1' INT TERM HUP
    "$nd/up.sh" $prefix $hosts ${mbit}mbit || exit 3
    # the physical limit: what TCP really gets through one tbf link
    "$psbench" --psd "$psd" --netns $prefix --link-only --pump-seconds 3 --link-streams 1,8 |
        tee "$results/link.txt"
    link_meas=$(sed -n 's/.* mbit_per_s=\([0-9.]*\).*/\1/p' "$results/link.txt" | sort -g | tail -n 1)
    echo "model,mode,servers,workers,dtype,codec,overlap,link_mbit,scale,gpu_step_ms,compute_ms,median_s,p10_s,p90_s,data_s,compute_s,comm_wait_s,steps_per_s,wire_out_per_iter,wire_in_per_iter,status,placement,partition_bytes,pull_credit,link_measured_mbit,schedule" >"$csv"
fi
# MB of the fp32 gradient, for a generous time limit per point
mb=$(awk -v m="$model" 'BEGIN { n["tsm-r50"] = 97.3; n["tsm-r18"] = 45.5; n["i3d-r50-311"] = 112.2; n["i3d-r50-333"] = 133.7; n["retinanet-r50"] = 136; print n[m] }')
points | while read -r mode s w d c o pl pb cr; do
    pl=${pl:-dedicated} pb=${pb:-4M} cr=${cr:-0}
    div=$s; [ "$mode" = ring ] && div=1
    lim=$(awk -v k=$((iters + warmup)) -v cm="$compute_ms" -v w=$w -v s=$div -v mb="$mb" -v r="$mbit" \
        'BEGIN { x = w / s; if (x < 2) x = 2; printf "%d", 3 * k * (cm / 1000 + 2 * x * mb * 8 / r) + 60 }')
    sv="--servers $s --partition-bytes $pb --pull-credit $cr"; [ "$mode" = ring ] && sv="--partition-bytes $pb"
    [ "$pl" = colocated ] && sv="$sv --colocate"
    cmd="$psbench --mode $mode --psd $psd --netns $prefix $sv --workers $w --model $model --dtype $d --codec $c --overlap $o --compute-ms $compute_ms --iters $iters --warmup $warmup --pump-seconds 0 --timeout-s $lim"
    if [ $dry = 1 ]; then
        echo "$cmd"
        continue
    fi
    l=$($cmd 2>&1 | grep "^psbench mode=$mode ")
    kv() { echo "$l" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
    if echo "$l" | grep -q 'median_s='; then st=ok; else st=failed; fi
    row="$model,$mode,$s,$w,$d,$c,$o,$mbit,$scale,$gpu_ms,$compute_ms,$(kv median_s),$(kv p10_s),$(kv p90_s),0,$(kv compute_s),$(kv comm_wait_s),$(kv steps_per_s),$(kv wire_out_per_iter),$(kv wire_in_per_iter),$st,$pl,$(kv partition_bytes),$cr,$link_meas,$(kv schedule)"
    echo "$row" >>"$csv"
    echo "# $row  [$(($(date +%s) - t_start)) s]"
done
[ $dry = 1 ] && exit 0
"$nd/down.sh" $prefix >/dev/null 2>&1
trap - EXIT
echo "# sweep done in $(($(date +%s) - t_start)) s"
[ $quick = 2 ] && exit 0 # the model comparison: its CSV alone
py=/usr/bin/python3
[ -x $py ] || py=python3
dflag="--docs $docs"; [ "$docs" = none ] && dflag=
$py "$here/analyze.py" --csv "$csv" --results "$results" $dflag --label "$label" \
    --wire-csv "$results/wire_accuracy.csv" || exit 1
sh "$here/plot.sh" "$results" || echo "scaling.sh: plots not drawn (see above)" >&2
echo "# total $(($(date +%s) - t_start)) s"
