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
# OpenMP's threads (the C engine's, PyTorch's) sleep when idle instead of
# spinning: on a loaded machine the spinning was a third of this check's CPU
export OMP_WAIT_POLICY=passive
B=$top_builddir

# the exports that wrote their files, checked together at the end (one
# Python process: torch and torchvision imported once), and their labels
DIRS=()
declare -A LABEL

py_checks() { # the Python check's results over DIRS, as this test's
    "$PY" "$top_srcdir/tests/tools/check_fasterrcnn_torch.py" "${DIRS[@]}" >"$T/py.out" 2>&1
    local r=$? line label= bad=0
    declare -A seen
    while IFS= read -r line; do
        case $line in
        "# dir: "*) label=${LABEL[${line#\# dir: }]} ;;
        "ok "*) ok 0 "$label: ${line#* - }"; seen[$label]=1 ;;
        "not ok "*) ok 1 "$label: ${line#* - }"; seen[$label]=1; bad=1 ;;
        "#"*) echo "$line" ;;
        esac
    done <"$T/py.out"
    local d shown=0
    for d in "${DIRS[@]}"; do
        [ -n "${seen[${LABEL[$d]}]}" ] && continue
        ok 1 "${LABEL[$d]}: check_fasterrcnn_torch.py checked it (rc $r)"
        [ $shown -eq 1 ] || show "$T/py.out" 20
        shown=1
    done
    if [ $r -ne 0 ] && [ $bad -eq 0 ] && [ $shown -eq 0 ]; then
        ok 1 "check_fasterrcnn_torch.py ran (rc $r)"
        show "$T/py.out" 20
    fi
}

export_model() { # NAME LABEL rcnn_export ARGS...
    local name=$1 label=$2
    shift 2
    run "export_$name" "$B/tests/tools/rcnn_export" "$T/$name" "$@"
    if ok $rc "$label: rcnn_export"; then
        DIRS+=("$T/$name")
        LABEL[$T/$name]=$label
    else
        show "$T/export_$name.out"
    fi
}

# Faster R-CNN and Cascade with torchvision's 100 detections; the Mask
# R-CNN exports at most 20 (their masks are checked on every detection,
# and four 256-wide 3x3 convolutions on 100 RoIs cost seconds on both sides)
export_model r50 "fasterrcnn_resnet50_fpn" 90 64 50 64 256 1024 0 1 100
export_model r18 "resnet_fpn_backbone(resnet18)" 3 64 18 64 256 1024 0 1 100
export_model m50 "maskrcnn_resnet50_fpn" 90 64 50 64 256 1024 256 1 20
export_model m18 "MaskRCNN(resnet_fpn_backbone(resnet18))" 3 64 18 64 256 1024 256 1 20
export_model c18 "Cascade R-CNN-R18 (tests/golden/cascade_ref.py)" 3 64 18 64 256 1024 0 3 100

run gen "$B/psdata" gen-det --out "$T/ds" --images 4 --val-images 1 --size 64 --classes 3
ok $rc "psdata gen-det" || show "$T/gen.out"
run train "$B/psworker" --standalone --model fasterrcnn-r18 --fpn-channels 32 --box-head-dim 64 \
    --size 64 --batch 2 --steps 2 --threads 2 --log-level warn --progress-every 0 \
    --train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train" --out "$T/run"
if ok $rc "psworker trained and exported fasterrcnn-r18 (FPN 32, box head 64)"; then
    export_model psw "psworker fasterrcnn-r18 export" 3 64 18 64 32 64 0 1 100 \
        "$T/run/model.safetensors"
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
    export_model psw_m "psworker maskrcnn-r18 export" 3 64 18 64 32 64 16 1 100 \
        "$T/run_m/model.safetensors"
else
    show "$T/train_m.out"
fi
[ ${#DIRS[@]} -gt 0 ] && py_checks
echo "1..$n"
[ $fails -eq 0 ]
