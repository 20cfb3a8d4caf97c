#!/bin/sh
# The CUDA kernels' logic on the CPU, on every machine (no GPU or toolkit
# needed): tests/cuda_emu/extract.py takes the kernels out of
# worker/engine/cuda/*.cu, tests/cuda_emu/emu.cpp runs them with OpenMP
# threads standing in for CUDA threads and compares with the CPU layers.
# TAP; exit 77 without a C++ compiler with OpenMP or python3.
src=${top_srcdir:-.}
b=${top_builddir:-.}
CXX=${CXX:-g++}
PY=python3
command -v "$PY" >/dev/null 2>&1 || PY=/usr/bin/python3
command -v "$CXX" >/dev/null 2>&1 || { echo "1..0 # SKIP no C++ compiler ($CXX)"; exit 77; }
[ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1 || { echo "1..0 # SKIP no python3"; exit 77; }
[ -f "$b/libps_engine.a" ] && [ -f "$b/libps_common.a" ] || {
    echo "1..0 # SKIP libraries not built"; exit 77; }
# what libps_engine.a links against (BLAS, oneDNN): make check's, else this build's
libs=${PS_ENGINE_EXT_LIBS-$(sed -n 's/^\(BLAS\|ONEDNN\)_LIBS = //p' "$b/Makefile" 2>/dev/null | tr '\n' ' ')}
d=$b/tests/cuda_emu.d
mkdir -p "$d" || exit 1
"$PY" "$src/tests/cuda_emu/extract.py" "$src/worker/engine/cuda" >"$d/kernels.inc" || {
    echo "Bail out! kernel extraction failed"; exit 1; }
if ! "$CXX" -std=c++17 -O1 -fopenmp -w -I"$src" -I"$src/common" -I"$d" -o "$d/emu" \
        "$src/tests/cuda_emu/emu.cpp" "$b/libps_engine.a" "$b/libps_common.a" \
        $libs -lm \
        >"$d/build.log" 2>&1; then
    if grep -q 'fopenmp\|omp.h' "$d/build.log"; then
        echo "1..0 # SKIP $CXX without OpenMP"; exit 77
    fi
    echo "Bail out! emu.cpp does not compile:"; sed 's/^/# /' "$d/build.log" | head -30; exit 1
fi
# passive waiting: up to 256 emulated threads share these cores
OMP_WAIT_POLICY=passive exec "$d/emu"
