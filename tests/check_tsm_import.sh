#!/usr/bin/env bash
# Official TSM checkpoints into psworker (docs/video.md; TAP; exit 77
# without torch / torchvision / PIL under /usr/bin/python3): the checks are
# tests/tools/check_tsm_import.py's (its docstring says what each compares
# against); this script makes the small dataset it evaluates on.  About
# 15 s on one core.
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch, torchvision, numpy, PIL" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision / numpy / PIL not importable by $PY"
    exit 77
fi
for b in psworker psdata tests/tools/weights_eval; do
    [ -x "$top_builddir/$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps_tsm_import.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! "$top_builddir/psdata" gen-video --out "$tmp/ds" --videos 12 --frames 8 --size 40 --seed 6 \
        --val-fraction 0.5 >"$tmp/gen.log" 2>&1; then
    echo "not ok 1 - psdata gen-video"
    sed 's/^/# /' "$tmp/gen.log"
    echo "1..1"
    exit 1
fi
"$PY" "$top_srcdir/tests/tools/check_tsm_import.py" --tmp "$tmp" \
    --weights-eval "$top_builddir/tests/tools/weights_eval" --psworker "$top_builddir/psworker" \
    --data "$tmp/ds"
