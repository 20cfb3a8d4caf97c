#!/bin/bash
# C-written Faster and Mask R-CNN checkpoints loaded into torchvision with
# strict=True, eval-mode outputs compared (tests/tools/check_fasterrcnn_torch.py):
# fasterrcnn_resnet50_fpn at torchvision's widths, the ResNet-18 variant
# built on resnet_fpn_backbone, and a psworker --model fasterrcnn-r18
# export (FPN 32, box head 64) trained two steps on a generated set; the
# same for Mask R-CNN (maskrcnn_resnet50_fpn, MaskRCNN on the ResNet-18
# backbone, a psworker --model maskrcnn-r18 export), masks included; a
# Cascade R-CNN into the test scripts' module (tests/golden/cascade_ref.py,
# Detectron2's semantics on torchvision's pieces).  TAP;
# exit 77 = skipped without torch / torchvision.
PY=${PS_PYTHON:-/usr/bin/python3}
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
if ! "$PY" -c "import torch, torchvision" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision not importable by $PY"
    exit 77
fi
. "$top_srcdir/tests/lib/tap_lib.sh"
tap_lib_init fasterrcnn_torch
B=$top_builddir

py_checks() { # DIR LABEL: the Python check's results, as this test's
    "$PY" "$top_srcdir/tests/tools/check_fasterrcnn_torch.py" "$1" >"$T/py.out" 2>&1
    local r=$? line seen=0 bad=0
    while IFS= read -r line; do
        case $line in
        "ok "*) ok 0 "$2: ${line#* - }"; seen=$((seen + 1)) ;;
        "not ok "*) ok 1 "$2: ${line#* - }"; seen=$((seen + 1)); bad=1 ;;
        "#"*) echo "$line" ;;
        esac
    done <"$T/py.out"
    if [ $seen -eq 0 ] || { [ $r -ne 0 ] && [ $bad -eq 0 ]; }; then
        ok 1 "$2: check_fasterrcnn_torch.py ran (rc $r)"
        show "$T/py.out" 20
    fi
}

export_check() { # NAME LABEL rcnn_export ARGS...
    local name=$1 label=$2
    shift 2
    run "export_$name" "$B/tests/tools/rcnn_export" "$T/$name" "$@"
    if ok $rc "$label: rcnn_export"; then py_checks "$T/$name" "$label"; else show "$T/export_$name.out"; fi
}

export_check r50 "fasterrcnn_resnet50_fpn" 90 64 50 64 256 1024 0 1
export_check r18 "resnet_fpn_backbone(resnet18)" 3 64 18 64 256 1024 0 1
export_check m50 "maskrcnn_resnet50_fpn" 90 64 50 64 256 1024 256 1
export_check m18 "MaskRCNN(resnet_fpn_backbone(resnet18))" 3 64 18 64 256 1024 256 1
export_check c18 "Cascade R-CNN-R18 (tests/golden/cascade_ref.py)" 3 64 18 64 256 1024 0 3

run gen "$B/psdata" gen-det --out "$T/ds" --images 4 --val-images 1 --size 64 --classes 3
ok $rc "psdata gen-det" || show "$T/gen.out"
run train "$B/psworker" --standalone --model fasterrcnn-r18 --fpn-channels 32 --box-head-dim 64 \
    --size 64 --batch 2 --steps 2 --threads 2 --log-level warn --progress-every 0 \
    --train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train" --out "$T/run"
if ok $rc "psworker trained and exported fasterrcnn-r18 (FPN 32, box head 64)"; then
    export_check psw "psworker fasterrcnn-r18 export" 3 64 18 64 32 64 0 1 "$T/run/model.safetensors"
else
    show "$T/train.out"
fi
run gen_m "$B/psdata" gen-det --out "$T/dsm" --images 4 --val-images 1 --size 64 --classes 3 --masks
ok $rc "psdata gen-det --masks" || show "$T/gen_m.out"
run train_m "$B/psworker" --standalone --model maskrcnn-r18 --fpn-channels 32 --box-head-dim 64 \
    --mask-head-dim 16 --size 64 --batch 2 --steps 2 --threads 2 --log-level warn \
    --progress-every 0 --train-json "$T/dsm/annotations/instances_train.json" --root "$T/dsm/train" \
    --out "$T/run_m"
if ok $rc "psworker trained and exported maskrcnn-r18 (FPN 32, box head 64, mask head 16)"; then
    export_check psw_m "psworker maskrcnn-r18 export" 3 64 18 64 32 64 16 1 "$T/run_m/model.safetensors"
else
    show "$T/train_m.out"
fi
echo "1..$n"
[ $fails -eq 0 ]
