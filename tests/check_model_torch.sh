#!/bin/sh
# C-written checkpoints into torchvision (TAP; exit 77 = skipped without
# torch).  tests/tools/model_export writes a TSM-ResNet-18 and a TSN-ResNet-50
# checkpoint plus the logits the C engine computes; check_model_torch.py
# loads them with load_state_dict(strict=True) and compares; and a
# TSM-style PyTorch checkpoint goes through worker/models/torch2safetensors.py
# into the engine.
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch not importable by $PY"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps_model_torch.XXXXXX") || exit 1
"$top_builddir/tests/tools/model_export" "$tmp/r18_tsm" 18 1 10 2 64 &&
"$top_builddir/tests/tools/model_export" "$tmp/r50_tsn" 50 0 7 1 32
rc=$?
if [ $rc -ne 0 ]; then
    echo "not ok 1 - model_export failed ($rc)"
    echo "1..1"
    rm -rf "$tmp"
    exit 1
fi
"$PY" "$top_srcdir/tests/tools/check_model_torch.py" --convert "$tmp" "$top_builddir/tests/tools/model_export" \
    "$tmp/r18_tsm" "$tmp/r50_tsn"
rc=$?
rm -rf "$tmp"
exit $rc
