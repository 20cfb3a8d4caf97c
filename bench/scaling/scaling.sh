#!/bin/sh
# Scaling sweep of PS mode in the emulated cluster (deploy/netns): workers x
# servers x wire dtype x overlap for one model's real partition layout, with
# the compute of a step emulated by a sleep.  Writes a CSV and prints the
# scaling efficiency.  Needs root (network namespaces); run it ALONE on the
# machine: the emulation is only right while the CPUs keep up with the links.
#
#   bench/scaling/scaling.sh [options]
#     --build DIR          where psbench and psd are (default: .)
#     --out FILE           CSV (default: scaling-<model>.csv)
#     --model M            tsm-r50 (default) | tsm-r18 | i3d-r50 | retinanet-r50
#     --workers "LIST"     default "1 2 4 8 16"
#     --servers "LIST"     default "1 2 4"
#     --dtypes "LIST"      default "fp32 fp16"
#     --overlap "LIST"     default "on off"
#     --scale F            slow-down factor (default 50, see below)
#     --gpu-step-ms T      compute of one step on the real GPU (default 53)
#     --iters K --warmup K timed / untimed steps per point (default 5 / 1)
#     --dry-run            print the psbench commands, run nothing
#
# Scaling rule.  The cluster being emulated: V100-class workers on 25 GbE.
# Two cores cannot move 16 x 25 Gb/s, so every link runs at 25 Gb/s / F and
# every step's compute takes T * F: communication and compute both take F
# times longer, so their ratio -- what scaling efficiency depends on -- is
# the real cluster's, as long as the per-message CPU costs (encode, sum,
# kernel) stay small against the slowed-down transfers.  Default F = 50:
# 500 Mbit/s per link, which keeps the bridge's total traffic (at most
# servers x 2 x 62.5 MB/s = 0.5 GB/s with 4 servers) well inside what two
# cores forward.
#
# T = 53 ms: one TSM-ResNet-50 step of 8 clips x 8 frames (64 frames at
# 224^2, the per-GPU batch assumed here) in mixed precision on a V100.  The
# frames cost what ResNet-50 images cost (the temporal shift adds no FLOPs;
# its memory moves are ignored); NVIDIA DeepLearningExamples (PyTorch
# ResNet-50 v1.5 README, DGX-1 V100 16GB, 1 GPU) measures 1200 img/s mixed
# precision (367 img/s FP32): 64 / 1200 = 53 ms (FP32: 174 ms, use
# --gpu-step-ms 174).  Shorter compute is the harder case for communication.
#
# Efficiency: eff_vs_1 = t(1 worker) / t(W workers) at the same servers,
# dtype and overlap (weak scaling: each worker keeps its batch);
# eff_vs_compute = compute / t(W) (against a step with free communication).
set -u
here=$(cd "$(dirname "$0")" && pwd)
nd=$here/../../deploy/netns
build=. out= model=tsm-r50 wl="1 2 4 8 16" sl="1 2 4" dl="fp32 fp16" ol="on off"
scale=50 gpu_ms=53 iters=5 warmup=1 dry=0
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --workers) wl=$2; shift 2 ;;
    --servers) sl=$2; shift 2 ;;
    --dtypes) dl=$2; shift 2 ;;
    --overlap) ol=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --gpu-step-ms) gpu_ms=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,42s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "scaling.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
out=${out:-scaling-$model.csv}
for v in "$scale" "$gpu_ms" "$iters" "$warmup"; do
    echo "$v" | grep -Eq '^[0-9]+(\.[0-9]+)?$' || { echo "scaling.sh: '$v' is not a number" >&2; exit 2; }
done
psbench=$build/psbench psd=$build/psd
[ -x "$psbench" ] && [ -x "$psd" ] || { echo "scaling.sh: no psbench/psd in $build (--build DIR)" >&2; exit 2; }
mbit=$(awk -v f="$scale" 'BEGIN { printf "%d", 25000 / f }')
compute_ms=$(awk -v t="$gpu_ms" -v f="$scale" 'BEGIN { printf "%g", t * f }')
bytes=$("$psbench" --model "$model" --help >/dev/null 2>&1 && echo ok)
[ -n "$bytes" ] || { echo "scaling.sh: psbench does not know --model $model" >&2; exit 2; }
maxw=0 maxs=0
for w in $wl; do [ "$w" -gt $maxw ] && maxw=$w; done
for s in $sl; do [ "$s" -gt $maxs ] && maxs=$s; done
hosts=$((maxw + maxs))
prefix=psns$$
echo "# scaling: model=$model link=${mbit}mbit (25 Gbit/s / $scale) compute_ms=$compute_ms" \
    "(${gpu_ms} ms x $scale) hosts=$hosts iters=$iters warmup=$warmup -> $out"

raw=$out.raw
if [ $dry = 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "scaling.sh: needs root (network namespaces)" >&2; exit 3; }
    trap '"$nd/down.sh" $prefix >/dev/null 2>&1; rm -f "$raw"' EXIT
    trap 'exit 1' INT TERM HUP
    "$nd/up.sh" $prefix $hosts ${mbit}mbit || exit 3
fi
[ $dry = 1 ] || echo "model,servers,workers,dtype,overlap,link_mbit,scale,gpu_step_ms,compute_ms,median_s,p10_s,p90_s,compute_s,comm_wait_s,steps_per_s,wire_out_per_iter,status" >"$raw"
# model bytes, for a generous time limit: (warmup+iters) steps of compute +
# every worker's gradient through one server link both ways, x3, + 60 s
mb=$(awk -v m="$model" 'BEGIN { n["tsm-r50"] = 97.3; n["tsm-r18"] = 45.5; n["i3d-r50"] = 188; n["retinanet-r50"] = 136; print n[m] }')
for s in $sl; do
    for w in $wl; do
        for d in $dl; do
            for o in $ol; do
                lim=$(awk -v k=$((iters + warmup)) -v c="$compute_ms" -v w=$w -v s=$s -v mb="$mb" -v r="$mbit" \
                    'BEGIN { printf "%d", 3 * k * (c / 1000 + 2 * w * mb * 8 / s / r) + 60 }')
                cmd="$psbench --psd $psd --netns $prefix --servers $s --workers $w --model $model --dtype $d --overlap $o --compute-ms $compute_ms --iters $iters --warmup $warmup --pump-seconds 0 --timeout-s $lim"
                if [ $dry = 1 ]; then
                    echo "$cmd"
                    continue
                fi
                l=$($cmd 2>&1 | grep '^psbench mode=ps ')
                kv() { echo "$l" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
                if echo "$l" | grep -q 'median_s='; then st=ok; else st=failed; fi
                row="$model,$s,$w,$d,$o,$mbit,$scale,$gpu_ms,$compute_ms,$(kv median_s),$(kv p10_s),$(kv p90_s),$(kv compute_s),$(kv comm_wait_s),$(kv steps_per_s),$(kv wire_out_per_iter),$st"
                echo "$row" >>"$raw"
                echo "# $row"
            done
        done
    done
done
[ $dry = 1 ] && exit 0
# efficiency columns: baseline = 1 worker at the same servers/dtype/overlap
awk -F, -v OFS=, 'NR == 1 { print $0, "eff_vs_1", "eff_vs_compute"; next }
    { rows[NR] = $0; if ($3 == 1 && $17 == "ok") base[$2 "," $4 "," $5] = $10 }
    END { for (i = 2; i <= NR; i++) { split(rows[i], f, ",")
            b = base[f[2] "," f[4] "," f[5]]
            e1 = (f[17] == "ok" && b > 0) ? sprintf("%.3f", b / f[10]) : "NA"
            ec = (f[17] == "ok" && f[10] > 0) ? sprintf("%.3f", f[9] / 1000 / f[10]) : "NA"
            print rows[i], e1, ec } }' "$raw" >"$out"
echo "# scaling efficiency ($out):"
awk -F, 'NR > 1 { printf "servers=%s workers=%-2s dtype=%s overlap=%-3s step_s=%s (real-cluster %.1f ms) comm_wait_s=%s eff_vs_1=%s eff_vs_compute=%s\n",
    $2, $3, $4, $5, $10, $10 * 1000 / $7, $14, $18, $19 }' "$out"
