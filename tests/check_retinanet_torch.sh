#!/bin/sh
# A C-written RetinaNet-ResNet-50-FPN checkpoint into torchvision's
# retinanet_resnet50_fpn with strict=True, outputs compared (TAP; exit 77 =
# skipped without torch / torchvision).
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch, torchvision" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision not importable by $PY"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps_retina_torch.XXXXXX") || exit 1
if ! "$top_builddir/tests/retina_export" "$tmp/r50" 91 64; then
    echo "not ok 1 - retina_export failed"
    echo "1..1"
    rm -rf "$tmp"
    exit 1
fi
"$PY" "$top_srcdir/tests/check_retinanet_torch.py" "$tmp/r50"
rc=$?
rm -rf "$tmp"
exit $rc
