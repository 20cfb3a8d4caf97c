#!/usr/bin/env bash
# The 3-D video models against PyTorch (TAP; exit 77 without torch /
# torchvision / numpy / PIL under /usr/bin/python3), by
# tests/tools/check_video3d_torch.py:
#   - every 3-D model at width 64 written by tests/tools/video3d_export
#     strict-loads into torchvision.models.video (r3d_18, mc3_18,
#     r2plus1d_18) or the I3D-ResNet-50 of tests/golden/gen_video3d.py, and
#     gives the C engine's logits (eval and training-mode BN) and BN
#     statistics;
#   - a torchvision resnet50 (random weights, made here, never downloaded)
#     through worker/models/torch2safetensors.py, inflated into I3D by the
#     engine (mean and centre): the same weights and logits as PyTorch's
#     own inflation;
#   - R(2+1)D-18 trained for 2 steps through 1 psd + 2 workers, and the
#     hash-initialised I3D-ResNet-50 (3x1x1), evaluated by psworker --eval
#     on a generated list (dense clips, 2 per video): the same logits,
#     predictions and top-1 / top-5 as PyTorch's evaluation of the same file.
PY=${PS_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, torchvision, numpy, PIL" >/dev/null 2>&1; then
    echo "1..0 # SKIP torch / torchvision / numpy / PIL not importable by $PY"
    exit 77
fi
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
EXP=$top_builddir/tests/tools/video3d_export
[ -x "$PSDATA" ] && [ -x "$EXP" ] || { echo "1..0 # SKIP psdata / video3d_export not built"; exit 77; }

fail_setup() {
    echo "not ok 1 - $1"
    show_log "$2"
    echo "1..1"
    tap_fail=1
    exit 1
}

# C-written models (K 5, 2 clips of 4 frames)
for a in r3d-18 mc3-18 r2plus1d-18; do
    "$EXP" "$T/$a" "$a" 5 2 4 32 2>"$T/exp.err" || fail_setup "video3d_export $a" "$T/exp.err"
done
"$EXP" "$T/i3d-r50-311" i3d-r50-311 5 2 4 48 2>"$T/exp.err" || fail_setup "video3d_export i3d-r50-311" "$T/exp.err"
"$EXP" "$T/i3d-r50-333" i3d-r50-333 5 2 4 48 2>"$T/exp.err" || fail_setup "video3d_export i3d-r50-333" "$T/exp.err"

# an ImageNet-layout resnet50 from torchvision (random weights and BN
# statistics), converted as a user would convert a downloaded one
"$PY" - "$T/r50.pth" <<'PYEOF' 2>"$T/r50.err" || fail_setup "torchvision resnet50" "$T/r50.err"
import sys, torch, torchvision
torch.manual_seed(3)
net = torchvision.models.resnet50()
with torch.no_grad():
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2); m.running_var.uniform_(0.5, 1.5)
            m.weight.uniform_(0.5, 1.5); m.bias.uniform_(-0.2, 0.2)
torch.save(net.state_dict(), sys.argv[1])
PYEOF
"$PY" "$top_srcdir/worker/models/torch2safetensors.py" "$T/r50.pth" "$T/r50.safetensors" \
    >/dev/null 2>"$T/conv.err" || fail_setup "torch2safetensors.py" "$T/conv.err"
"$EXP" --inflate mean "$T/r50.safetensors" "$T/infl_mean" i3d-r50-311 1000 1 4 48 \
    2>"$T/exp.err" || fail_setup "video3d_export --inflate mean" "$T/exp.err"
"$EXP" --inflate centre "$T/r50.safetensors" "$T/infl_centre" i3d-r50-333 1000 1 4 48 \
    2>"$T/exp.err" || fail_setup "video3d_export --inflate centre" "$T/exp.err"

# --eval of a trained R(2+1)D-18 (1 psd + 2 workers) and of the hash I3D
"$PSDATA" gen-video --out "$T/ds" --videos 8 --frames 12 --size 40 --seed 4 --val-fraction 0.5 \
    >/dev/null 2>"$T/gen.err" || fail_setup "psdata gen-video" "$T/gen.err"
COMMON=(--size 32 --frames 4 --stride 2 --val-clips 2 --num-classes 5 --threads 1
        --loader-threads 1 --root "$T/ds" --val-list "$T/ds/val.txt")
start_cluster 1 2 --mode sync || fail_setup "psd did not start" "$T/psd0.log"
WORKER_TIMEOUT=120 run_workers 2 "$T/run" --model r2plus1d-18 "${COMMON[@]}" \
    --train-list "$T/ds/train.txt" --flip 0 --dropout 0 --lr 0.01 --steps 2 --batch 2 \
    --seed 5 --data-seed 9 || fail_setup "r2plus1d-18 through 1 psd + 2 workers" "$T/run/w0.err"
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
PIDS=()
"$PSW" --eval --model r2plus1d-18 "${COMMON[@]}" --weights "$T/run/model.safetensors" \
    --predictions "$T/pred_r2p1d.csv" --log-level warn >"$T/eval_r2p1d.out" 2>"$T/eval.err" ||
    fail_setup "psworker --eval r2plus1d-18" "$T/eval.err"
COMMON[1]=48
"$PSW" --eval --model i3d-r50-311 "${COMMON[@]}" --weights "$T/i3d-r50-311/model.safetensors" \
    --predictions "$T/pred_i3d.csv" --log-level warn >"$T/eval_i3d.out" 2>"$T/eval.err" ||
    fail_setup "psworker --eval i3d-r50-311" "$T/eval.err"

EV=(--val-list "$T/ds/val.txt" --root "$T/ds" --frames 4 --stride 2 --clips 2)
"$PY" "$top_srcdir/tests/tools/check_video3d_torch.py" \
    export "$T/r3d-18" "$T/mc3-18" "$T/r2plus1d-18" "$T/i3d-r50-311" "$T/i3d-r50-333" \
    -- inflate "$T/infl_mean" mean "$T/r50.safetensors" \
    -- inflate "$T/infl_centre" centre "$T/r50.safetensors" \
    -- eval --weights "$T/run/model.safetensors" "${EV[@]}" --size 32 \
            --predictions "$T/pred_r2p1d.csv" --eval-out "$T/eval_r2p1d.out" \
    -- eval --weights "$T/i3d-r50-311/model.safetensors" "${EV[@]}" --size 48 \
            --predictions "$T/pred_i3d.csv" --eval-out "$T/eval_i3d.out"
rc=$?
[ $rc -eq 0 ] || tap_fail=1
exit $rc
