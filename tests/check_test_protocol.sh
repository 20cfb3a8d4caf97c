#!/bin/sh
# TSM's test protocol (--eval --test-clips N --test-crops 1|3) against a
# numpy / PIL / PyTorch reference of the crop geometry and the averaging
# (docs/video.md; TAP; exit 77 without torch / PIL under /usr/bin/python3).
# The checks and their controls are tests/tools/check_test_protocol.py's.
# About 10 s on one core.
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch, numpy, PIL" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / numpy / PIL not importable by $PY"
    exit 77
fi
[ -x "$top_builddir/psworker" ] || { echo "1..0 # SKIP psworker not built"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_protocol.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$PY" "$top_srcdir/tests/tools/check_test_protocol.py" --tmp "$tmp" --psworker "$top_builddir/psworker"
