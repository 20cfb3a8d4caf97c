#!/usr/bin/env bash
# The exported model in PyTorch (docs/video.md; TAP, exit 77 without
# torch / torchvision / PIL under /usr/bin/python3).  Trains TSM-ResNet-18
# (width 64, so it is torchvision's resnet18) for a few steps with 1 psd + 2
# workers on a small generated direction dataset, BN in training mode (the
# running statistics averaged through the server, --bn-sync), evaluates the
# exported model.safetensors with psworker --eval --predictions, and hands
# both to tests/tools/check_export_torch.py, which evaluates the same file with
# torchvision + TSM's shift + TSM's PIL test pipeline and compares logits,
# predictions and top-1 / top-5.  About 10-20 s on one core.
PY=${PS_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, torchvision, numpy, PIL" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision / numpy / PIL not importable by $PY"
    exit 77
fi
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

fail_setup() {
    echo "not ok 1 - $1"
    show_log "$2"
    echo "1..1"
    tap_fail=1
    exit 1
}

# 40x40 frames: the test transform really resizes (shorter side 36) and crops 32
"$PSDATA" gen-video --out "$T/ds" --videos 24 --frames 8 --size 40 --seed 4 --val-fraction 0.5 \
    >/dev/null 2>"$T/gen.err" || fail_setup "psdata gen-video" "$T/gen.err"
COMMON=(--model tsm-r18 --size 32 --frames 4 --num-classes 4 --threads 1 --loader-threads 1
        --root "$T/ds" --val-list "$T/ds/val.txt")
start_cluster 1 2 --mode sync || fail_setup "psd did not start" "$T/psd0.log"
run_workers 2 "$T/run" "${COMMON[@]}" --train-list "$T/ds/train.txt" --flip 0 --dropout 0 \
    --bn train --lr 0.02 --momentum 0.9 --steps 4 --batch 2 --seed 5 --data-seed 9 \
    || fail_setup "training with 1 psd + 2 workers" "$T/run/w0.err"
stop_pids
PIDS=()
"$PSW" --eval "${COMMON[@]}" --weights "$T/run/model.safetensors" --predictions "$T/pred.csv" \
    --log-level warn >"$T/eval.out" 2>"$T/eval.err" || fail_setup "psworker --eval" "$T/eval.err"
"$PY" "$top_srcdir/tests/tools/check_export_torch.py" --weights "$T/run/model.safetensors" --depth 18 \
    --shift 1 --val-list "$T/ds/val.txt" --root "$T/ds" --frames 4 --size 32 \
    --predictions "$T/pred.csv" --eval-out "$T/eval.out" --train-out "$T/run/w0.out"
rc=$?
[ $rc -eq 0 ] || tap_fail=1
exit $rc
