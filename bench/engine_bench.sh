#!/bin/sh
# Engine vs PyTorch, same run, same machine: a TSM training step (forward +
# backward, 2 clips x 8 frames at 112x112, 2 threads) of ResNet-18 and -50,
# then the ratio PyTorch time / engine time (>= 1.0: the engine is at least
# as fast) and the roofline note (achieved GFLOP/s vs the sgemm peak
# measured in the same run).  Run alone on an idle machine:
#
#   bench/engine_bench.sh [BUILDDIR] [steps]
#
# BUILDDIR holds bench/engine_bench (default: the current directory).
# PS_PYTHON overrides the interpreter (Debian's python3-torch: /usr/bin/python3).
# PS_BENCH_PROFILE=1 adds the engine's per-layer-kind time split (engine_bench -p).
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-.}
steps=${2:-10}
threads=${PS_BENCH_THREADS:-2}
PY=${PS_PYTHON:-/usr/bin/python3}
exe=$build/bench/engine_bench
[ -x "$exe" ] || { echo "engine_bench.sh: $exe not built (make bench/engine_bench)" >&2; exit 1; }
out=$(mktemp "${TMPDIR:-/tmp}/engine_bench.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT

echo "== C engine ($exe)"
"$exe" -t "$threads" -s "$steps" ${PS_BENCH_PROFILE:+-p} | tee -a "$out" || exit 1
echo
if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "== PyTorch ($PY)"
    OMP_NUM_THREADS=$threads "$PY" "$here/engine_bench_torch.py" --threads "$threads" \
        --steps "$steps" | tee -a "$out" || exit 1
else
    echo "== PyTorch: not importable by $PY, no ratio"
fi
echo
awk '
/^RESULT/ {
    delete kv
    for (i = 2; i <= NF; i++) { split($i, p, "="); kv[p[1]] = p[2] }
    if ("sgemm_gflops" in kv) { peak[kv["impl"]] = kv["sgemm_gflops"]; next }
    k = kv["impl"] "," kv["depth"]
    step[k] = kv["step_ms"]; fwd[k] = kv["fwd_ms"]; bwd[k] = kv["bwd_ms"]
    gf[k] = kv["gflops"]; cps[k] = kv["clips_per_s"]; depths[kv["depth"]] = 1
}
END {
    printf "%-14s %10s %10s %10s %9s %9s %8s %7s\n", "model", "impl", "fwd ms", "bwd ms",
           "step ms", "clips/s", "GFLOP/s", "%peak"
    for (d in depths) for (j = 0; j < 2; j++) {
        impl = j ? "torch" : "c"; k = impl "," d
        if (!(k in step)) continue
        pk = peak[impl] > 0 ? 100 * gf[k] / peak[impl] : 0
        printf "%-14s %10s %10.1f %10.1f %9.1f %9.2f %8.1f %6.0f%%\n", "TSM-ResNet-" d, impl,
               fwd[k], bwd[k], step[k], cps[k], gf[k], pk
    }
    for (d in depths) {
        if (("c," d) in step && ("torch," d) in step)
            printf "ratio TSM-ResNet-%s: PyTorch step / engine step = %.2f (fwd %.2f, bwd %.2f)\n",
                   d, step["torch," d] / step["c," d], fwd["torch," d] / fwd["c," d],
                   bwd["torch," d] / bwd["c," d]
    }
    printf "sgemm peak: engine (OpenBLAS) %.1f GFLOP/s, PyTorch torch.mm %.1f GFLOP/s\n",
           peak["c"], peak["torch"]
}' "$out"
