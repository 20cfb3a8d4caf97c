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
if ! "$top_builddir/tests/tools/retina_export" "$tmp/r50" 91 64; then
    echo "not ok 1 - retina_export failed"
    echo "1..1"
    rm -rf "$tmp"
    exit 1
fi
"$PY" "$top_srcdir/tests/tools/check_retinanet_torch.py" "$tmp/r50" | sed -n '/^1\.\./!p' >"$tmp/tap1"
rc=$?
n1=$(grep -c '^\(not \)\?ok' "$tmp/tap1")
cat "$tmp/tap1"
# psworker's export: RetinaNet-ResNet-18-FPN (FPN 32, P6 on C5) trained one
# step on a generated set, loaded strictly into a torchvision RetinaNet on
# resnet18 and compared output for output (re-saved by retina_export with
# the outputs of the C engine for the hash input)
n=$n1
if [ -x "$top_builddir/psdata" ] && [ -x "$top_builddir/psworker" ]; then
    "$top_builddir/psdata" gen-det --out "$tmp/ds" --images 4 --val-images 1 --size 64 \
        --classes 3 >/dev/null 2>&1 &&
    "$top_builddir/psworker" --standalone --model retinanet-r18 --fpn-channels 32 --size 64 \
        --batch 2 --steps 1 --threads 2 --log-level warn --progress-every 0 \
        --train-json "$tmp/ds/annotations/instances_train.json" --root "$tmp/ds/train" \
        --out "$tmp/run" >"$tmp/psw.out" 2>&1 &&
    "$top_builddir/tests/tools/retina_export" "$tmp/r18" 3 64 18 32 "$tmp/run/model.safetensors"
    r=$?
    n=$((n + 1))
    if [ $r -ne 0 ]; then
        echo "not ok $n - psworker retinanet-r18 export (psdata / psworker / retina_export failed)"
        sed 's/^/# /' "$tmp/psw.out"
        rc=1
    else
        echo "ok $n - psworker trained and exported retinanet-r18 (FPN 32)"
        "$PY" "$top_srcdir/tests/tools/check_retinanet_torch.py" "$tmp/r18" | sed -n '/^1\.\./!p' |
            awk -v base=$n '{ if (sub(/^ok [0-9]+/, "ok " (base + (++k)))) print; \
                else if (sub(/^not ok [0-9]+/, "not ok " (base + (++k)))) { print; bad = 1 } \
                else print } END { exit bad }' >"$tmp/tap2"
        [ $? -eq 0 ] || rc=1
        cat "$tmp/tap2"
        n=$((n + $(grep -c '^\(not \)\?ok' "$tmp/tap2")))
    fi
fi
echo "1..$n"
grep -q '^not ok' "$tmp/tap1" && rc=1
rm -rf "$tmp"
exit $rc
