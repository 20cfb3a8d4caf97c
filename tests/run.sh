#!/usr/bin/env bash
# Build everything and run the test suite (make check).  Installs missing
# Debian packages when run as root.  Usage: ./tests/run.sh [make-check args]
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/deps.sh
ps_ensure_packages
ps_want_packages gnuplot-nox || true # tests/test_plots.sh skips without it
ps_build
# Tests run one at a time per core; the integration tests start processes.
if ! make -j"$(nproc)" check "$@"; then
    for f in $(grep -l -E '^(not ok|# FAIL|ERROR)' tests/*.log 2>/dev/null); do
        echo "==== $f"; tail -n 40 "$f"
    done
    exit 1
fi
