#!/usr/bin/env bash
# CI fuzzing stage: build the six libFuzzer harnesses (tests/fuzz/build.sh)
# and run each for a bounded time on a scratch copy of its seed corpus.
# Fails on any crash, leak, sanitizer report or hang; prints the executions
# per target.  Exit 77 (skipped) when clang-14 / libclang-rt-14-dev are
# missing and we are not root to install them.
#
# Usage: tests/fuzz/ci.sh [SECONDS]     (default 20 per target)
#   PS_FUZZ_DIR  build and scratch directory (default: <repo>/fuzz-build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
secs=${1:-${PS_FUZZ_SECONDS:-20}}
out=${PS_FUZZ_DIR:-$top/fuzz-build}
targets="codec wire safetensors config video_list coco"

missing=()
command -v clang-14 >/dev/null 2>&1 || missing+=(clang-14)
dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q 'install ok installed' ||
    missing+=(libclang-rt-14-dev)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "fuzz: SKIP, missing ${missing[*]}; as root run:"
        echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
        exit 77
    fi
    echo "fuzz: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
        { echo "fuzz: apt-get install ${missing[*]} failed" >&2; exit 1; }
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "fuzz: building harnesses in $out"
if ! CC=clang-14 "$here/build.sh" "$out" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log"
    echo "fuzz: build failed" >&2
    exit 1
fi

status=0
rm -rf "$out/artifacts"
mkdir -p "$out/artifacts"
for t in $targets; do
    work="$out/corpus-$t"
    rm -rf "$work"
    mkdir -p "$work"
    cp "$here/corpus/$t"/* "$work"/
    seeds=$(ls "$work" | wc -l)
    log="$out/fuzz_$t.log"
    rc=0
    # -close_fd_mask=3: the harnesses' own error logging is noise here
    # (libFuzzer's reports still reach the log); -timeout: a hang is a bug
    (cd "$out" && timeout $((secs + 120)) ./fuzz_$t -max_total_time="$secs" -timeout=25 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
        "$work") >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    if [ $rc -ne 0 ]; then
        echo "fuzz: fuzz_$t FAILED (exit $rc) after ${execs:-?} executions; log $log:"
        tail -n 60 "$log"
        status=1
    else
        echo "fuzz: fuzz_$t ok: ${execs:-?} executions in ${secs}s (${rate:-?}/s), corpus $seeds -> $(ls "$work" | wc -l) inputs"
    fi
done
if ls "$out/artifacts"/* >/dev/null 2>&1; then
    echo "fuzz: crash/leak/timeout inputs (reproduce: $out/fuzz_<target> FILE):"
    ls -l "$out/artifacts"
    status=1
fi
exit $status
