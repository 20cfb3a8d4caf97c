#!/usr/bin/env bash
# ONNX export checked in onnxruntime (docs/video.md; TAP).  The PyPI
# packages onnx and onnxruntime go in a venv this check makes once
# ($PS_ONNX_VENV, default tests/venv-onnx under the build tree); where they
# cannot be had (no python3-venv, no network) the check is skipped (77).
#  1. tests/tools/onnx_export writes TSM-R18 ('blockres', 1/8), TSM-R18
#     ('block', 1/4), TSN-R50 and RetinaNet-R18-FPN from the hash init with
#     random BN; tests/tools/check_onnx.py: the ONNX checker accepts each,
#     onnxruntime's outputs equal the C engine's within 1e-4 + 1e-3*|c|.
#  2. TSM-R18 trained a few steps through 1 psd on a generated dataset:
#     psworker --export-onnx and psctl export --onnx (from the servers) of
#     the same weights; onnxruntime on TSM's test pipeline in numpy / PIL
#     gives psworker --eval's per-video logits within 1e-4 + 1e-3*|c|, one
#     clip centre crop and 2 clips x 3 crops (TSM's test protocol); the two
#     files give identical outputs.
#  3. Bad input: a weights file with a wrong shape, an export into a missing
#     folder, psctl asked for another depth: an error naming the tensor /
#     file, no output written, an existing file left as it was.
# About 20 s on one core once the venv exists.
PY=${PS_PYTHON:-/usr/bin/python3}
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
PSCTL=$top_builddir/psctl
OXP=$top_builddir/tests/tools/onnx_export
for b in "$PSDATA" "$PSCTL" "$OXP"; do
    [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done
VENV=${PS_ONNX_VENV:-$top_builddir/tests/venv-onnx}
VPY=$VENV/bin/python
if ! "$VPY" -c "import onnx, onnxruntime, numpy, PIL" >/dev/null 2>&1; then
    rm -rf "$VENV"
    if ! "$PY" -m venv --system-site-packages "$VENV" >"$T/venv.log" 2>&1 ||
       ! timeout 600 "$VENV/bin/pip" install --disable-pip-version-check -q --retries 1 \
           --timeout 20 onnx onnxruntime >>"$T/venv.log" 2>&1 ||
       ! "$VPY" -c "import onnx, onnxruntime, numpy, PIL" >>"$T/venv.log" 2>&1; then
        echo "1..0 # SKIP onnx / onnxruntime not installable in a venv of $PY ($(tail -n 1 "$T/venv.log"))"
        rm -rf "$VENV"
        exit 77
    fi
fi
CHK=$top_srcdir/tests/tools/check_onnx.py

# Run a python check (its own TAP) and fold its results into ours.
pycheck() {
    local out=$T/py$tap_n.out rc line
    "$VPY" "$CHK" "$@" >"$out" 2>&1
    rc=$?
    while IFS= read -r line; do
        case $line in
            "ok "*) ok 0 "${line#ok * - }" ;;
            "not ok "*) ok 1 "${line#not ok * - }" ;;
            "#"*) echo "$line" ;;
        esac
    done <"$out"
    [ "$rc" -eq 0 ] || { ok 1 "check_onnx.py $1 exited $rc"; show_log "$out" 30; }
}

# ---- 1. the graph builder against the C engine ----------------------------------
"$OXP" "$T/tsm_blockres" video 18 1 blockres 8 5 2 4 32 8 &&
"$OXP" "$T/tsm_block" video 18 1 block 4 5 2 4 32 8 &&
"$OXP" "$T/tsn" video 50 0 blockres 8 3 1 3 32 8 &&
"$OXP" "$T/retina" retina 18 3 2 64 8 16 2>"$T/oxp.err"
ok $? "onnx_export wrote the four graphs" || show_log "$T/oxp.err"
pycheck tool "$T/tsm_blockres" "$T/tsm_block" "$T/tsn" "$T/retina"

# ---- 2. psworker --export-onnx and psctl export --onnx on a trained model -----
"$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 40 --seed 4 --val-fraction 0.5 \
    >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video" || show_log "$T/gen.err"
COMMON=(--model tsm-r18 --width 16 --size 32 --frames 4 --num-classes 4 --threads 1
        --loader-threads 1 --root "$T/ds" --val-list "$T/ds/val.txt")
mkdir -p "$T/ckpt"
start_cluster 1 1 --mode sync --checkpoint-dir "$T/ckpt" || { ok 1 "psd started"; tap_done; }
run_workers 1 "$T/run" "${COMMON[@]}" --train-list "$T/ds/train.txt" --flip 0 --dropout 0 \
    --bn train --lr 0.02 --steps 3 --batch 2 --seed 5
ok $? "3 training steps through psd" || show_log "$T/run/w0.err"
W=$T/run/model.safetensors
"$PSW" --export-onnx "$T/w.onnx" "${COMMON[@]}" --weights "$W" >"$T/exp.out" 2>"$T/exp.err" &&
    grep -q "onnx=$T/w.onnx" "$T/exp.out"
ok $? "psworker --export-onnx" || show_log "$T/exp.err"
"$PSCTL" --servers "$SERVERS" checkpoint >"$T/ck.out" 2>&1
spec=$(ls "$T"/ckpt/psd-0-*.safetensors 2>/dev/null | tail -n 1)
"$PSCTL" --servers "$SERVERS" export --onnx --model tsm-r18 --frames 4 --size 32 --spec "$spec" \
    "$T/c.onnx" >"$T/psctl.out" 2>&1 && grep -q "102 tensors from the servers" "$T/psctl.out"
ok $? "psctl export --onnx: every tensor (weights, averaged BN statistics) from the servers" ||
    show_log "$T/psctl.out"
"$PSW" --export-onnx "$T/auto.onnx" --model tsm-r18 --width 16 --size 32 --frames 4 --weights "$W" \
    >"$T/auto.out" 2>"$T/auto.err" && grep -q "4 classes from" "$T/auto.err" && cmp -s "$T/w.onnx" "$T/auto.onnx"
ok $? "--export-onnx without lists or --num-classes: 4 classes from fc.weight, the same file" ||
    show_log "$T/auto.err"
"$PSCTL" --servers "$SERVERS" export --onnx --model tsm-r34 --frames 4 --size 32 --spec "$spec" \
    "$T/r34.onnx" >"$T/r34.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "layer1.2.conv1.weight is not on the servers" "$T/r34.out" &&
    grep -q -- "--like" "$T/r34.out" && [ ! -e "$T/r34.onnx" ]
ok $? "psctl export --onnx --model tsm-r34 of an R18: exit $rc naming the missing tensor and --like" ||
    show_log "$T/r34.out"
"$PSW" --eval "${COMMON[@]}" --weights "$W" --predictions "$T/p1.csv" --log-level warn \
    >"$T/e1.out" 2>"$T/e1.err"
ok $? "psworker --eval, 1 clip, centre crop" || show_log "$T/e1.err"
pycheck video --onnx "$T/w.onnx" --same "$T/c.onnx" --val-list "$T/ds/val.txt" --root "$T/ds" \
    --frames 4 --size 32 --predictions "$T/p1.csv" --eval-out "$T/e1.out"
"$PSW" --eval "${COMMON[@]}" --weights "$W" --test-clips 2 --test-crops 3 --predictions "$T/p6.csv" \
    --log-level warn >"$T/e6.out" 2>"$T/e6.err" && grep -q "clips=2 crops=3" "$T/e6.out"
ok $? "psworker --eval --test-clips 2 --test-crops 3" || show_log "$T/e6.err"
pycheck video --onnx "$T/w.onnx" --val-list "$T/ds/val.txt" --root "$T/ds" --frames 4 --size 32 \
    --clips 2 --crops 3 --predictions "$T/p6.csv" --eval-out "$T/e6.out"

# ---- 3. bad input ------------------------------------------------------------------
"$PY" - "$W" "$T/bad.safetensors" <<'EOF' 2>"$T/badgen.err"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
s = h["layer2.0.conv1.weight"]["shape"]
h["layer2.0.conv1.weight"]["shape"] = [s[1], s[0]] + s[2:]  # same bytes, wrong shape
j = json.dumps(h, separators=(",", ":")).encode()
j += b" " * ((8 - len(j) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:])
EOF
ok $? "a weights file with layer2.0.conv1.weight transposed" || show_log "$T/badgen.err"
cp "$T/w.onnx" "$T/keep.onnx"
"$PSW" --export-onnx "$T/keep.onnx" "${COMMON[@]}" --weights "$T/bad.safetensors" \
    >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc -ne 0 ] && grep -q "layer2.0.conv1.weight" "$T/bad.err" && cmp -s "$T/w.onnx" "$T/keep.onnx" &&
    ! ls "$T"/keep.onnx.tmp.* >/dev/null 2>&1
ok $? "wrong shape: exit $rc naming layer2.0.conv1.weight, the existing file untouched" ||
    show_log "$T/bad.err"
"$PSW" --export-onnx "$T/no/such/dir/x.onnx" "${COMMON[@]}" --weights "$W" >"$T/nd.out" 2>"$T/nd.err"
rc=$?
[ $rc -ne 0 ] && grep -q "no/such/dir/x.onnx" "$T/nd.err" && [ ! -e "$T/no" ]
ok $? "export into a missing folder: exit $rc naming the file" || show_log "$T/nd.err"
tap_done
