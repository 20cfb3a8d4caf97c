#!/bin/sh
# Engine vs PyTorch, same run, same machine: a training step (forward +
# backward, 2 clips x 8 frames at 112x112, 2 threads) of TSM-ResNet-18 and
# -50 and of the 3-D models r3d-18 (torchvision.models.video's on the
# PyTorch side) and I3D-ResNet-50 3x1x1 / 3x3x3 (Conv3d models), then the
# ratio PyTorch time / engine time (>= 1.0: the engine is at least as
# fast) and the roofline note (achieved GFLOP/s vs the sgemm peak measured
# in the same run).  Where the CPU multiplies bf16 natively
# (AVX-512 BF16, AMX) the same in bf16: the engine's -P bf16 against
# PyTorch's CPU autocast, each also against its own fp32.  Run alone on an
# idle machine:
#
#   bench/engine_bench.sh [BUILDDIR] [steps]
#
# BUILDDIR holds bench/engine_bench (default: the current directory).
# It prints the CPU (model, the instruction sets that pick kernels), the
# sgemm library and OpenBLAS core, oneDNN's instruction set, and which
# convolution kernels ran (calls per direction; PS_BENCH_KERNELS=1: per
# layer shape with every candidate's time).
# PS_PYTHON overrides the interpreter (Debian's python3-torch: /usr/bin/python3).
# PS_BENCH_PROFILE=1 adds the engine's per-layer-kind time split (engine_bench -p).
# PS_BENCH_MODELS overrides the models (default
# tsm-r18,tsm-r50,r3d-18,i3d-r50-311,i3d-r50-333).
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
steps=${2:-10}
threads=${PS_BENCH_THREADS:-2}
PY=${PS_PYTHON:-/usr/bin/python3}
models=${PS_BENCH_MODELS:-tsm-r18,tsm-r50,r3d-18,i3d-r50-311,i3d-r50-333}
exe=$build/bench/engine_bench
[ -x "$exe" ] || { echo "engine_bench.sh: $exe not built (make bench/engine_bench)" >&2; exit 1; }
out=$(mktemp "${TMPDIR:-/tmp}/engine_bench.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
bf16=0
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && bf16=1
have_torch=0
"$PY" -c "import torch" >/dev/null 2>&1 && have_torch=1

echo "== C engine, fp32 ($exe)"
"$exe" -t "$threads" -s "$steps" -m "$models" ${PS_BENCH_PROFILE:+-p} ${PS_BENCH_KERNELS:+-k} |
    tee -a "$out" || exit 1
echo
if [ $have_torch = 1 ]; then
    echo "== PyTorch, fp32 ($PY)"
    OMP_NUM_THREADS=$threads "$PY" "$here/engine_bench_torch.py" --threads "$threads" \
        --steps "$steps" --models "$models" | tee -a "$out" || exit 1
else
    echo "== PyTorch: not importable by $PY, no ratio"
fi
echo
if [ $bf16 = 1 ]; then
    echo "== C engine, bf16"
    "$exe" -t "$threads" -s "$steps" -m "$models" -P bf16 ${PS_BENCH_KERNELS:+-k} |
        tee -a "$out" || exit 1
    echo
    if [ $have_torch = 1 ]; then
        echo "== PyTorch, bf16 autocast"
        OMP_NUM_THREADS=$threads "$PY" "$here/engine_bench_torch.py" --threads "$threads" \
            --steps "$steps" --models "$models" --autocast | tee -a "$out" || exit 1
    fi
else
    echo "== bf16: not measured: this CPU has no native bf16 (no avx512_bf16 / amx_bf16 flag)"
fi
echo
awk -v models="$models" '
/^RESULT/ {
    delete kv
    for (i = 2; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
    if ("sgemm_gflops" in kv) { peak[kv["impl"]] = kv["sgemm_gflops"]; next }
    if ("refused" in kv) next
    k = kv["impl"] "," kv["prec"] "," kv["model"]
    step[k] = kv["step_ms"]; fwd[k] = kv["fwd_ms"]; bwd[k] = kv["bwd_ms"]
    gf[k] = kv["gflops"]; cps[k] = kv["clips_per_s"]
}
END {
    nm = split(models, order, ",")
    printf "%-14s %6s %5s %10s %10s %9s %9s %8s %7s\n", "model", "impl", "prec", "fwd ms",
           "bwd ms", "step ms", "clips/s", "GFLOP/s", "%peak"
    for (i = 1; i <= nm; i++) for (j = 0; j < 4; j++) {
        d = order[i]; impl = j % 2 ? "torch" : "c"; pr = j < 2 ? "fp32" : "bf16"
        k = impl "," pr "," d
        if (!(k in step)) continue
        pk = peak[impl] > 0 ? 100 * gf[k] / peak[impl] : 0
        printf "%-14s %6s %5s %10.1f %10.1f %9.1f %9.2f %8.1f %6.0f%%\n", d, impl, pr, fwd[k],
               bwd[k], step[k], cps[k], gf[k], pk
    }
    for (i = 1; i <= nm; i++) {
        d = order[i]; c = "c,fp32," d; t = "torch,fp32," d; cb = "c,bf16," d; tb = "torch,bf16," d
        if ((c in step) && (t in step))
            printf "ratio %s: PyTorch step / engine step = %.2f (fwd %.2f, bwd %.2f)\n",
                   d, step[t] / step[c], fwd[t] / fwd[c], bwd[t] / bwd[c]
        if ((cb in step) && (c in step))
            printf "ratio %s bf16: engine fp32 / engine bf16 = %.2f\n", d, step[c] / step[cb]
        if ((cb in step) && (tb in step))
            printf "ratio %s bf16: PyTorch autocast / engine bf16 = %.2f\n", d,
                   step[tb] / step[cb]
        if ((tb in step) && (t in step))
            printf "ratio %s bf16: PyTorch fp32 / PyTorch autocast = %.2f\n", d,
                   step[t] / step[tb]
    }
    printf "sgemm peak: engine %.1f GFLOP/s, PyTorch torch.mm %.1f GFLOP/s\n", peak["c"],
           peak["torch"]
}' "$out"
