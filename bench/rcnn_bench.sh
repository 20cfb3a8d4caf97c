#!/bin/sh
# The two-stage detectors' CPU training step against torchvision's, same
# machine, same run: bench/rcnn_bench (the engine) and
# bench/rcnn_bench_torch.py (torchvision 0.14's FasterRCNN / MaskRCNN, and
# Cascade R-CNN as tests/golden/cascade_ref.py's heads on them: torchvision
# has none) on the same configuration, inputs' shapes and ground truth,
# alternately -- per round, each model on our side then on torch's -- for
# REPS rounds; then a table of the medians over the rounds and the ratio
# torchvision step / our step (>= 1.0: ours is at least as fast), with the
# per-image work of each side (proposals after NMS, box head RoIs over
# every stage, mask RoIs: they depend on the weights, so the torch side
# loads the initial weights ours writes (rcnn_bench -o, --weights) and the
# counts agree up to NMS's float rounding), the CPU and the kernels that ran.  Run alone on an
# idle machine:
#
#   bench/rcnn_bench.sh [reps]          (default 3)
#
# Environment: PS_BENCH_BUILD (the build folder holding bench/rcnn_bench;
# default the source tree's), PS_PYTHON (default /usr/bin/python3, Debian's
# python3-torch), PS_BENCH_THREADS (2), PS_BENCH_STEPS (5 timed steps per
# run), PS_BENCH_WARMUP (1), PS_BENCH_MODELS (faster,mask,cascade),
# PS_BENCH_DEPTHS (18; e.g. 18,50), PS_BENCH_ACCEPTANCE=1 (the narrow
# configuration of the acceptance runs: rcnn_bench -A), PS_BENCH_SIZE /
# PS_BENCH_IMAGES (override the configuration's image side and batch).
# Exits non-zero when a side fails; without an importable torch the torch
# side is skipped (said so) and no ratio is printed.
here=$(cd "$(dirname "$0")" && pwd)
reps=${1:-3}
threads=${PS_BENCH_THREADS:-2}
steps=${PS_BENCH_STEPS:-5}
warmup=${PS_BENCH_WARMUP:-1}
models=${PS_BENCH_MODELS:-faster,mask,cascade}
depths=${PS_BENCH_DEPTHS:-18}
PY=${PS_PYTHON:-/usr/bin/python3}
exe=${PS_BENCH_BUILD:-$here/..}/bench/rcnn_bench

for v in "reps=$reps" "PS_BENCH_THREADS=$threads" "PS_BENCH_STEPS=$steps" \
         "PS_BENCH_WARMUP=$warmup" "PS_BENCH_SIZE=${PS_BENCH_SIZE:-1}" \
         "PS_BENCH_IMAGES=${PS_BENCH_IMAGES:-1}"; do
    case ${v#*=} in
        '' | *[!0-9]*) echo "rcnn_bench.sh: $v: want a whole number" >&2; exit 2 ;;
    esac
done
[ "$reps" -ge 1 ] || { echo "rcnn_bench.sh: reps=$reps: want at least 1" >&2; exit 2; }
[ -x "$exe" ] || { echo "rcnn_bench.sh: $exe not built (make bench/rcnn_bench)" >&2; exit 1; }

# the same configuration on both sides
c_args="-t $threads -s $steps -w $warmup"
py_args="--threads $threads --steps $steps --warmup $warmup"
if [ "${PS_BENCH_ACCEPTANCE:-0}" = 1 ]; then
    c_args="$c_args -A"
    py_args="$py_args --acceptance"
fi
if [ -n "$PS_BENCH_SIZE" ]; then
    c_args="$c_args -H $PS_BENCH_SIZE"
    py_args="$py_args --size $PS_BENCH_SIZE"
fi
if [ -n "$PS_BENCH_IMAGES" ]; then
    c_args="$c_args -n $PS_BENCH_IMAGES"
    py_args="$py_args --images $PS_BENCH_IMAGES"
fi

out=$(mktemp "${TMPDIR:-/tmp}/rcnn_bench.XXXXXX") || exit 1
# each model's initial weights, written by ours and loaded by torch's side,
# so both start from the same weights and propose the same boxes
wdir=$(mktemp -d "${TMPDIR:-/tmp}/rcnn_bench_w.XXXXXX") || { rm -f "$out"; exit 1; }
trap 'rm -rf "$out" "$out.run" "$wdir"' EXIT
c_args="$c_args -o $wdir/"
py_args="$py_args --weights $wdir/"
have_torch=0
"$PY" -c "import torch, torchvision" >/dev/null 2>&1 && have_torch=1

echo "cpu model: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
[ $have_torch = 1 ] ||
    echo "== torch side SKIPPED: $PY cannot import torch and torchvision; no ratio"
models_sp=$(echo "$models" | tr ',' ' ')
depths_sp=$(echo "$depths" | tr ',' ' ')

# one run of model $m at depth $d in round $r: its output shown and kept,
# each line prefixed with the round and the run, for the table; a failure
# ends the benchmark
one_run() { # SIDE COMMAND...
    side=$1
    shift
    "$@" >"$out.run" 2>&1
    rc=$?
    cat "$out.run"
    sed "s/^/round=$r run=$m-r$d /" "$out.run" >>"$out"
    [ $rc = 0 ] && return 0
    echo "rcnn_bench.sh: $side failed ($m ResNet-$d, round $r, exit $rc)" >&2
    exit 1
}

r=1
while [ "$r" -le "$reps" ]; do
    for d in $depths_sp; do
        for m in $models_sp; do
            echo "== round $r/$reps: $m ResNet-$d, ours ($exe $c_args -d $d -m $m)"
            # shellcheck disable=SC2086
            one_run ours "$exe" $c_args -d "$d" -m "$m"
            [ $have_torch = 1 ] || continue
            echo "== round $r/$reps: $m ResNet-$d, torchvision ($PY rcnn_bench_torch.py" \
                 "$py_args --depth $d --models $m)"
            # shellcheck disable=SC2086
            one_run torchvision env OMP_NUM_THREADS="$threads" "$PY" "$here/rcnn_bench_torch.py" \
                $py_args --depth "$d" --models "$m"
        done
    done
    r=$((r + 1))
done
rm -f "$out.run"
echo
echo "== kernels"
sed -n 's/^round=1 run=[^ ]* cpu: /cpu: /p' "$out" | head -n 1
sed -n 's/^round=1 run=[^ ]* kernels: sgemm/ours: sgemm/p' "$out" | head -n 1
awk -v last="round=$reps" '$1 == last && $3 == "conv:" {
    run = substr($2, 5); $1 = $2 = $3 = ""; sub(/^ */, "")
    print "ours, " run ": conv " $0 }' "$out"
sed -n 's/^round=1 run=[^ ]* kernels: PyTorch/torchvision: PyTorch/p' "$out" | head -n 1
echo
awk -v models="$models" -v depths="$depths" -v reps="$reps" '
function median(list,    n, v, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) {
        t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
    }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
$3 == "RESULT" {
    split("", kv)
    for (i = 4; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
    k = kv["impl"] "," kv["model"] "," kv["depth"]
    step[k] = step[k] " " kv["step_ms"]; fwd[k] = fwd[k] " " kv["fwd_ms"]
    bwd[k] = bwd[k] " " kv["bwd_ms"]; nr[k]++
    if (kv["new_conv_shapes"] > 0) newsh[k] += kv["new_conv_shapes"]
    batch[k] = kv["batch"]; props[k] = kv["proposals"]; rois[k] = kv["rois"]
    mrois[k] = kv["mask_rois"]
    cfg[kv["model"] "," kv["depth"]] = kv["size"] "x" kv["size"] " x" kv["batch"] ", " \
        kv["threads"] " threads, width " kv["width"] ", FPN " kv["fpn"]
}
END {
    nm = split(models, M, ","); nd = split(depths, D, ",")
    printf "%-8s %5s %-6s %6s %10s %10s %10s %9s %9s %8s %9s\n", "model", "depth", "impl",
           "rounds", "fwd ms", "bwd ms", "step ms", "images/s", "props/img", "RoIs/img",
           "maskRoIs"
    for (a = 1; a <= nd; a++) for (b = 1; b <= nm; b++) for (j = 0; j < 2; j++) {
        impl = j ? "torch" : "c"; k = impl "," M[b] "," D[a]
        if (!(k in step)) continue
        s = median(step[k])
        printf "%-8s %5s %-6s %6d %10.1f %10.1f %10.1f %9.2f %9.0f %8.0f %9.1f\n", M[b], D[a],
               impl, nr[k], median(fwd[k]), median(bwd[k]), s, (s > 0 ? 1000 * batch[k] / s : 0),
               props[k], rois[k], mrois[k]
    }
    for (a = 1; a <= nd; a++) for (b = 1; b <= nm; b++) {
        c = "c," M[b] "," D[a]; t = "torch," M[b] "," D[a]
        if ((c in step) && (t in step))
            printf "ratio %s ResNet-%s (%s): torchvision step / ours = %.2f (fwd %.2f, bwd %.2f)\n",
                   M[b], D[a], cfg[M[b] "," D[a]], median(step[t]) / median(step[c]),
                   median(fwd[t]) / median(fwd[c]), median(bwd[t]) / median(bwd[c])
        if (c in newsh)
            printf "note %s ResNet-%s: ours met %d new convolution shape-directions inside timed " \
                   "steps (their kernel measurement is in the times: raise PS_BENCH_WARMUP)\n",
                   M[b], D[a], newsh[c]
    }
}' "$out"
