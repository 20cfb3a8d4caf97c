#!/usr/bin/env bash
# The timed half of the TSM paper's study on this machine: TSM against I3D
# (and TSN, R3D) trained through psd by ./deploy/local-cluster.sh, in one
# run, alone on the machine.
#
#   bench/video_study.sh [--parts throughput,accuracy,scaling|none] [--out DIR] [--build DIR]
#                        [--size S] [--steps N] [--budget SECONDS]
#                        [--models M,M,...] [--acc-models M,M,...] [--device DEV]
#
# throughput  every --models row at the clip of its paper (TSM / TSN: 8
#             segments; I3D-ResNet-50: 32 frames every 2nd; R3D-18: 16
#             frames every 2nd), full width, --size^2 (default 112; the
#             papers use 224, which quadruples every model's compute and
#             leaves the ratios), 2 psd + 2 workers x batch 2, --steps
#             timed steps (default 7) after 3 untimed ones (the first step
#             times every convolution kernel).  Per model: the medians of
#             rank 0's step, data wait, compute and communication wait
#             (metrics-rank0.csv), the cluster's clips/s, frames and bytes
#             read per clip, and the ratio of TSM-R50's clips/s to each
#             model's (the paper: 1.8x I3D).
# accuracy    every --acc-models row on the generated direction data at
#             ./deploy/local-cluster.sh's settings, each given the same
#             training budget (--budget seconds, default 120, of rank 0's
#             step time; validation passes not counted): a calibration
#             run of 24 steps measures the model's step time, the model
#             then trains budget / step steps with the cosine schedule
#             fitted to them; val top-1 at four points and at the end,
#             against training time.
# scaling     bench/scaling/scaling.sh --models for TSM-R50 and both I3D-R50
#             variants with their real partition layouts on the emulated
#             25 GbE cluster (needs root: network namespaces; about 13
#             minutes): co-located PS and the ring, fp16, overlap on, W = 1
#             to 16, each model's GPU compute scaled from TSM-R50's 53 ms by
#             its training FLOPs per clip; scaling efficiency (compute /
#             step) per model and W.
#
# --device DEV (cpu, cuda:N) is psworker's for the throughput and accuracy
# runs (default cpu).
# --parts none draws the plots of DIR's data again and runs nothing.
# Writes DIR (default bench/video_study_results) throughput.csv,
# accuracy.csv, accuracy_curve.dat, scaling.csv, scaling.dat, the run
# directories under DIR/runs, and with gnuplot throughput.png (stacked step
# split), accuracy.png (val top-1 against training seconds) and scaling.png
# (efficiency against workers); prints the tables docs/video.md holds.
# Needs psd, psworker, psdata (built: make, or --build DIR).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build=$src out=$src/bench/video_study_results parts=throughput,accuracy,scaling
size=112 steps=7 budget=120 device=cpu
models=tsm-r50,tsn-r50,i3d-r50-311,i3d-r50-333,r3d-18
acc_models=tsm-r18,tsn-r18,tsm-r50,i3d-r50-311
usage() { sed -n '2,/^set -uo/s/^# \{0,1\}//p' "$0" | sed '$d'; }
while [ $# -gt 0 ]; do
    case $1 in
    --parts) parts=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --size) size=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --budget) budget=${2:?}; shift 2 ;;
    --models) models=${2:?}; shift 2 ;;
    --acc-models) acc_models=${2:?}; shift 2 ;;
    --device) device=${2:?}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "video_study: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in size steps budget; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "video_study: --$v must be a positive integer (got '${!v}')" >&2; exit 2; }
done
for b in psd psworker psdata; do
    [ -x "$build/$b" ] || { echo "video_study: $build/$b not built (make $b)" >&2; exit 1; }
done
mkdir -p "$out/runs" || exit 1
out=$(cd "$out" && pwd)
lc() { PS_BIN_DIR=$build PS_RUN_ROOT=$out/runs "$src/deploy/local-cluster.sh" "$@"; }
# the run directory a local-cluster.sh output names
run_dir() { sed -n 's/.*; run dir \(.*\)$/\1/p' "$1" | tail -n 1; }

# the clip of each model's paper: frames, then psworker's sampling flags
paper_clip() {
    case $1 in
    tsm-* | tsn-*) echo "8" ;;
    i3d-*) echo "32 --stride 2" ;;
    r3d-* | mc3-* | r2plus1d-*) echo "16 --stride 2" ;;
    *) return 1 ;;
    esac
}

# medians over rank 0's steps after the first 3 (metrics-rank0.csv:
# iteration,loss,lr,step_ms,compute_ms,comm_wait_ms,data_wait_ms,...):
# "step compute comm data"
step_medians() {
    local c
    for c in 4 5 6 7; do
        awk -F, -v c=$c 'NR > 1 && $1 > 2 { print $c }' "$1" | sort -g |
            awk '{ v[NR] = $1 } END { if (!NR) { print "nan"; exit }
                 print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
    done | tr '\n' ' '
}
# key=value of a run's final: line
final_val() { grep '^final:' "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }

direction=$src/data/direction
ensure_direction() {
    [ -f "$direction/train.txt" ] && return 0
    "$build/psdata" gen-video --out "$direction" --videos 800 --frames 16 --size 48 --seed 1 \
        --classes 4 >/dev/null || { echo "video_study: psdata gen-video failed" >&2; exit 1; }
}

throughput() {
    # the direction data with an 8-video validation list: the final
    # validation of a full-width 3-D model at 112^2 would take minutes
    local d=$out/data m r log T rest csv=$out/throughput.csv
    ensure_direction
    mkdir -p "$d" || exit 1
    for f in "$direction"/vid_*; do [ -e "$d/${f##*/}" ] || ln -s "$f" "$d/"; done
    cp "$direction/train.txt" "$d/train.txt" && head -n 8 "$direction/val.txt" >"$d/val.txt" || exit 1
    echo "model,frames,size,step_ms,compute_ms,comm_wait_ms,data_wait_ms,cluster_clips_per_s,frames_per_clip,bytes_per_clip,decode_ms_per_clip" >"$csv"
    for m in ${models//,/ }; do
        read -r T rest <<<"$(paper_clip "$m")" || { echo "video_study: no paper clip for $m" >&2; exit 2; }
        log=$out/runs/throughput-$m.log
        echo "== throughput: $m, $T frames, ${size}^2, 2 psd + 2 workers x batch 2, $((steps + 3)) steps"
        # shellcheck disable=SC2086 # rest: psworker flags
        lc --model "$m" --data "$d" --size "$size" --frames "$T" --width 64 --batch 2 \
            --steps $((steps + 3)) -- $rest --val-every 0 --no-plots --device "$device" >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; echo "video_study: $m failed (log: $log)" >&2; exit 1; }
        r=$(run_dir "$log")
        read -r st co cm da <<<"$(step_medians "$r/metrics-rank0.csv")"
        awk -v m="$m" -v T="$T" -v s="$size" -v st="$st" -v co="$co" -v cm="$cm" -v da="$da" \
            -v f="$(final_val "$r/worker0.log" frames_per_clip)" \
            -v b="$(final_val "$r/worker0.log" bytes_per_clip)" \
            -v dm="$(final_val "$r/worker0.log" decode_ms_per_clip)" \
            'BEGIN { printf "%s,%d,%d,%.1f,%.1f,%.1f,%.1f,%.3f,%s,%s,%s\n", m, T, s, st, co, cm, da,
                     2 * 2 * 1000 / st, f, b, dm }' >>"$csv"
        tail -n 1 "$csv"
    done
    echo
    echo "| model | clip | step ms (rank 0, median) | data wait | compute | comm wait | clips/s (2 workers) | TSM-R50 clips/s / this | frames/clip | bytes/clip | decode ms/clip |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    awk -F, 'NR == 1 { next } { row[NR] = $0; if ($1 == "tsm-r50") tsm = $8 }
        END { for (i = 2; i <= NR; i++) { split(row[i], v, ",")
            printf "| %s | %d x %d^2 | %.0f | %.0f | %.0f | %.0f | %.2f | %s | %s | %s | %s |\n", v[1], v[2], v[3],
                v[4], v[7], v[5], v[6], v[8], tsm ? sprintf("%.2fx", tsm / v[8]) : "-", v[9], v[10], v[11] } }' "$csv"
}

accuracy() {
    local m log r st n csv=$out/accuracy.csv curve=$out/accuracy_curve.dat
    ensure_direction
    echo "model,step_ms,steps,train_s,top1,top5,val_loss" >"$csv"
    : >"$curve"
    for m in ${acc_models//,/ }; do
        log=$out/runs/calibrate-$m.log
        echo "== accuracy: $m, calibration (24 steps)"
        lc --model "$m" --steps 24 -- --val-every 0 --no-plots --device "$device" >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; echo "video_study: $m calibration failed (log: $log)" >&2; exit 1; }
        r=$(run_dir "$log")
        read -r st _ <<<"$(step_medians "$r/metrics-rank0.csv")"
        n=$(awk -v b="$budget" -v s="$st" 'BEGIN { printf "%d", b * 1000 / s }')
        [ "$n" -ge 4 ] || { echo "video_study: $m: a ${budget}s budget is $n steps of $st ms" >&2; exit 1; }
        log=$out/runs/accuracy-$m.log
        echo "== accuracy: $m, $n steps (${budget} s at $st ms a step)"
        lc --model "$m" --steps "$n" -- --no-plots --device "$device" >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; echo "video_study: $m failed (log: $log)" >&2; exit 1; }
        r=$(run_dir "$log")
        # val top-1 against rank 0's training time at that step (the sum of
        # its step times: validation passes are not training)
        # (the final validation, after the last step, at the whole time)
        { echo "\"$m\""; echo "0 0.25"
          awk -F, 'FNR == 1 { next } FILENAME == ARGV[1] { t += $4; at[$1 + 1] = t / 1000; next }
                   { print ($1 in at) ? at[$1] : t / 1000, $4 }' "$r/metrics-rank0.csv" "$r/val.csv"
          echo; echo; } >>"$curve"
        awk -F, -v m="$m" -v st="$st" -v n="$n" 'FNR == 1 { next } FILENAME == ARGV[1] { t += $4; next }
             { top1 = $4; top5 = $5; loss = $3 }
             END { printf "%s,%.1f,%d,%.1f,%s,%s,%s\n", m, st, n, t / 1000, top1, top5, loss }' \
            "$r/metrics-rank0.csv" "$r/val.csv" >>"$csv"
        tail -n 1 "$csv"
    done
    echo
    echo "| model | step ms (calibrated) | steps in ${budget} s | training s used | val top-1 | val top-5 | val loss |"
    echo "|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$csv"
}

scaling() {
    local m csv=$out/scaling.csv dat=$out/scaling.dat
    [ "$(id -u)" = 0 ] || { echo "video_study: the scaling part needs root (network namespaces): skipped"; return 0; }
    echo "model,mode,workers,gpu_step_ms,compute_s,median_s,efficiency" >"$csv"
    : >"$dat"
    for m in tsm-r50 i3d-r50-311 i3d-r50-333; do
        echo "== scaling: $m (bench/scaling/scaling.sh --models)"
        sh "$src/bench/scaling/scaling.sh" --models --model "$m" --build "$build" \
            --results "$out/scaling-$m" --docs none >"$out/runs/scaling-$m.log" 2>&1 ||
            { tail -n 20 "$out/runs/scaling-$m.log" >&2; echo "video_study: scaling $m failed" >&2; exit 1; }
        # efficiency = the emulated compute / the step (psbench's median)
        awk -F, 'NR > 1 && $21 == "ok" { printf "%s,%s,%s,%s,%.3f,%s,%.4f\n", $1, $2, $4, $10,
                 $11 / 1000, $12, $11 / 1000 / $12 }' "$out/scaling-$m/scaling-$m.csv" >>"$csv"
    done
    awk -F, 'NR > 1 { k = $1 " " ($2 == "ps" ? "PS co-located" : "ring"); if (!(k in seen)) { seen[k] = 1; order[++n] = k }
                      v[k] = v[k] $3 " " $7 "\n" }
        END { for (i = 1; i <= n; i++) printf "\"%s\"\n%s\n\n", order[i], v[order[i]] }' "$csv" >"$dat"
    echo
    echo "| model | GPU step (ms) | mode | W = 1 | 2 | 4 | 8 | 16 |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -F, 'NR > 1 { k = $1 "|" $4 "|" ($2 == "ps" ? "PS co-located" : "ring"); if (!(k in e)) order[++n] = k
                      e[k] = e[k] sprintf(" %.0f%% |", 100 * $7) }
        END { for (i = 1; i <= n; i++) { split(order[i], p, "|"); printf "| %s | %s | %s |%s\n", p[1], p[2], p[3], e[order[i]] } }' "$csv"
}

plots() {
    command -v gnuplot >/dev/null 2>&1 || { echo "video_study: no gnuplot: no plots (apt-get install gnuplot-nox)"; return 0; }
    cd "$out" || return 1
    {
        echo 'set terminal pngcairo size 900,520 font "sans,10"'
        echo 'set grid; set datafile separator ","'
        if [ -s throughput.csv ]; then
            echo 'set output "throughput.png"'
            echo "set title \"Step split per model at its paper's clip, ${size}^2, 2 psd + 2 workers x batch 2 (rank 0, medians)\""
            echo 'set style data histograms; set style histogram rowstacked; set style fill solid 0.8 border -1'
            echo 'set boxwidth 0.6; set ylabel "ms per step"; set yrange [0:*]; set key top left'
            echo 'plot "throughput.csv" every ::1 using 7:xtic(1) title "data wait", "" every ::1 using 5 title "compute", "" every ::1 using 6 title "comm wait"'
        fi
        if [ -s scaling.dat ]; then
            echo 'set output "scaling.png"; set datafile separator whitespace; unset style'
            echo 'set title "Scaling efficiency on the emulated 25 GbE cluster (fp16, overlap on; real partition layouts)"'
            echo 'set style data linespoints; set logscale x 2; set xlabel "workers"; set ylabel "efficiency (compute / step)"'
            echo 'set yrange [0:1.05]; set key bottom left'
            echo "plot for [i=0:$(($(grep -c '^"' scaling.dat) - 1))] \"scaling.dat\" index i using 1:2 title columnheader(1)"
            echo 'unset logscale x'
        fi
        if [ -s accuracy_curve.dat ]; then
            echo 'set output "accuracy.png"; set datafile separator whitespace'
            echo "set title \"Val top-1 on the direction data against training time (same ${budget} s budget each)\""
            echo 'set style data linespoints; set xlabel "training seconds (rank 0)"; set ylabel "val top-1"'
            echo 'set yrange [0:1.02]; set key bottom right'
            echo "plot for [i=0:$(($(grep -c '^"' accuracy_curve.dat) - 1))] \"accuracy_curve.dat\" index i using 1:2 title columnheader(1), 0.25 with lines dt 2 title \"chance\""
        fi
    } | gnuplot || { echo "video_study: gnuplot failed" >&2; return 1; }
    ls -1 "$out"/*.png 2>/dev/null
}

echo "video_study: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; results in $out"
case ",$parts," in *,throughput,*) throughput ;; esac
case ",$parts," in *,accuracy,*) accuracy ;; esac
case ",$parts," in *,scaling,*) scaling ;; esac
plots
