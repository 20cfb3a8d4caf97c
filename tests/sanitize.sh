#!/usr/bin/env bash
# Sanitizer build (ASan + UBSan) of the unit and integration tests: a
# separate build of a copy of the source tree under ./build-asan (git-ignored),
# --without-cuda, then `make check` with every sanitizer report fatal.
#
# Usage: tests/sanitize.sh [make-check args]
#   PS_ASAN_DIR   build directory (default: <repo>/build-asan)
#   PS_ASAN_SKIP  tests left out (default below; "" runs every test)
#   PS_ASAN_TIMES append "user sys wall test" CPU seconds per test to this file
#
# Why a copy: CI configures the checkout in place (tests/run.sh), and
# automake refuses a VPATH build of a configured source tree.  The copy keeps
# file times, so a second run rebuilds only what changed.
#
# How a report fails the run: ASan/UBSan abort the process (halt_on_error,
# abort_on_error; UBSan is also compiled non-recoverable), which fails a test
# that checks its children; and every report is also written to a file under
# $PS_ASAN_DIR/reports, so one from a child a test does not wait for (a psd a
# shell test kills at the end) fails the run too.  Leak checking is on;
# tests/lib/lsan.supp (committed) lists leaks in system libraries we cannot fix,
# each with its reason.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${PS_ASAN_DIR:-$top/build-asan}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# Left out, with the reason (CPU seconds measured under ASan on this
# machine; the tests that run take about 120 s of CPU in all):
# - check_model_torch.sh, check_retinanet_torch.sh,
#   check_fasterrcnn_torch.sh, check_roi_align_torch.sh: their time goes
#   into PyTorch, which is not instrumented; the C side runs sanitized in
#   test_model_io, test_retinanet, test_fasterrcnn and test_roi_align.
# - test_cuda_emu.sh: builds its own C++ program with its own flags.
# - test_resnet: compares gradients with PyTorch's at a tolerance the -O2
#   build meets (worst norm error 0.00098) and this -O1 build does not
#   (0.0019: other ReLU decisions flip); also the costliest here (26 s).  Its
#   model code still runs sanitized in test_model_io, test_retinanet and the
#   video integration test.
# - test_deploy.sh: checks that the Dockerfile installs every library the
#   binaries link, and these link libasan/libubsan.
# - test_psctl.sh: parses psctl's stdout+stderr as JSON, and under ASan
#   ps_client.c logs a warning that mallopt() is refused (ASan's allocator
#   refuses it).
# - test_fault_load: asserts psd's RSS stays within 10% over a load run, and
#   ASan's quarantine and allocator caches grow it (51.8 -> 57.2 MB even with
#   a 32 MB quarantine); psd's bad-input and fault paths still run sanitized
#   in test_psd_badinput, test_fault_sigstop and test_fault_checkpoint_kill.
# - check_onnx.sh: makes a venv and installs onnx / onnxruntime from PyPI
#   (network; in this build tree a second venv); check_tsm_import.sh: its
#   time goes into PyTorch.  Their C side (the loader, the ONNX writer) runs
#   sanitized in test_weights and test_onnx, psworker's --eval with TSM's
#   test protocol in check_test_protocol.sh.
# Put one back once its owner has made it independent of the build.
PS_ASAN_SKIP=${PS_ASAN_SKIP-tests/check_model_torch.sh tests/check_retinanet_torch.sh \
tests/check_fasterrcnn_torch.sh tests/check_roi_align_torch.sh \
tests/test_cuda_emu.sh tests/test_resnet tests/test_deploy.sh tests/test_psctl.sh tests/test_fault_load \
tests/check_onnx.sh tests/check_tsm_import.sh}

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

stage() { echo "==== sanitize: $*"; }

# 1. copy the source tree: tracked files plus untracked, not-ignored ones
stage "copying sources to $dir/src"
mkdir -p "$dir/src"
(cd "$top" &&
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -z --cached --others --exclude-standard
    else
        find . -path ./build-asan -prune -o -path ./fuzz-build -prune -o -path ./.git -prune \
            -o -type f -print0
    fi | grep -zv -E '^(\./)?(build-asan|fuzz-build)/' |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar -c --null -T - -f -) | tar -x -p -C "$dir/src" -f -

# 2. configure (once) and build
if [ ! -x "$dir/src/configure" ]; then
    stage "autoreconf"
    (cd "$dir/src" && autoreconf -fi >/dev/null 2>&1) || { echo "sanitize: autoreconf failed" >&2; exit 1; }
fi
mkdir -p "$dir/build"
cd "$dir/build"
if [ ! -f Makefile ]; then
    stage "configure"
    "$dir/src/configure" --quiet --without-cuda \
        CFLAGS="-O1 -g $SAN" LDFLAGS="$SAN" CXXFLAGS="-O1 -g $SAN" ||
        { echo "sanitize: configure failed (see $dir/build/config.log)" >&2; exit 1; }
fi
stage "build"
make -j"$(nproc)" >build.log 2>&1 || { tail -n 40 build.log; echo "sanitize: build failed" >&2; exit 1; }
make -j"$(nproc)" check TESTS= >>build.log 2>&1 || { tail -n 40 build.log; echo "sanitize: building the tests failed" >&2; exit 1; }

# 3. run the tests with every report fatal
tests=$(make -s -f Makefile -f - ps-print-tests <<'EOF'
ps-print-tests:
	@echo $(TESTS)
EOF
)
run=""
for t in $tests; do
    case " $PS_ASAN_SKIP " in *" $t "*) ;; *) run="$run $t" ;; esac
done
# no stale results: a left-out test's old log must not be reported below
rm -rf reports test-suite.log tests/*.log tests/*.trs && mkdir reports
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:log_path=$dir/build/reports/asan:log_exe_name=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$dir/build/reports/ubsan:log_exe_name=1"
export LSAN_OPTIONS="suppressions=$top/tests/lib/lsan.supp:print_suppressions=0"
stage "make check ($(echo $run | wc -w) tests; left out: ${PS_ASAN_SKIP:-none})"
timing=()
if [ -n "${PS_ASAN_TIMES:-}" ]; then
    # wrap the test driver's compiler so each test's CPU time is recorded
    printf '#!/bin/sh\nexec /usr/bin/time -a -o "%s" -f "%%U %%S %%e $*" "$@"\n' \
        "$PS_ASAN_TIMES" >timed.sh
    chmod +x timed.sh
    timing=(LOG_COMPILER="$dir/build/timed.sh /bin/bash $dir/src/tests/lib/skip77.sh")
fi
status=0
make -j"$(nproc)" check TESTS="$run" "${timing[@]}" "$@" || status=1
if [ $status -ne 0 ]; then
    for f in $(grep -l -E '^(not ok|# FAIL|ERROR)' tests/*.log 2>/dev/null); do
        echo "==== $f"; tail -n 40 "$f"
    done
fi
# a report from a process nobody waited for still fails the run
reports=$(find reports -type f | sort)
if [ -n "$reports" ]; then
    for f in $reports; do echo "==== sanitizer report $f"; cat "$f"; done
    status=1
fi
[ $status -eq 0 ] && stage "passed" || stage "FAILED"
exit $status
