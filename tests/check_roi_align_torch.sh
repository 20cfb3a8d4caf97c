#!/bin/sh
# RoIAlign live against torchvision: tests/golden/gen_roi_align.py with a
# fresh seed (the committed golden uses another) into a temporary file, then
# tests/test_roi_align on it (TAP passes through; exit 77 = skipped without
# torch / torchvision).
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch, torchvision" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision not importable by $PY"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps_roi_align.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
seed=$(( $(date +%s) % 100000 + 1 ))
echo "# seed $seed"
if ! "$PY" "$top_srcdir/tests/golden/gen_roi_align.py" "$tmp/g.bin" "$seed" >"$tmp/gen.log" 2>&1; then
    echo "Bail out! gen_roi_align.py failed:"
    sed 's/^/# /' "$tmp/gen.log"
    exit 1
fi
"$top_builddir/tests/test_roi_align" "$tmp/g.bin"
