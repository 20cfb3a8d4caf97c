#!/usr/bin/env bash
# What the C code writes, read and scored by pycocotools (PyPI; TAP, exit 77
# = skipped where pycocotools cannot be had):
#   - psdata gen-det --masks: every annotation's mask gives back its area
#     and box under pycocotools' own rasterisation;
#   - ps_coco_save_results with masks (tests/tools/coco_results, on the
#     generated set and on the segm golden): loadRes reads it, and COCOeval's
#     bbox and segm stats equal the C evaluator's;
#   - psworker --eval --predictions FILE (RetinaNet after 3 steps; Mask
#     R-CNN after 400, boxes and masks): pycocotools' AP, AP50, AP75 of
#     FILE equal what psworker printed, and the masks' AP and AP50 are above
#     zero.
# pycocotools comes from a venv this check makes once ($PS_PYCOCO_VENV,
# default ~/.cache/psd-pycocotools-venv; it sees Debian's numpy), or from the
# interpreter $PS_PYCOCO_PYTHON names.
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
for b in psdata psworker tests/tools/coco_results; do
    [ -x "$top_builddir/$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done
# the venv: made once, under a lock (several builds or checks may start it
# at once), in the user's cache so the sanitizer build and later runs reuse it
make_venv() {
    "$venv/bin/python" -c "import pycocotools.coco" >/dev/null 2>&1 && return 0
    rm -rf "$venv"
    echo "# making $venv: pip install pycocotools (once)"
    { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
      timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check pycocotools; } \
        >"$venv.log" 2>&1
}
PYC=${PS_PYCOCO_PYTHON:-}
if [ -z "$PYC" ]; then
    cache=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}
    venv=${PS_PYCOCO_VENV:-${cache:-$top_builddir/tests}/psd-pycocotools-venv}
    mkdir -p "$(dirname "$venv")"
    if command -v flock >/dev/null 2>&1; then
        ( flock 9; make_venv ) 9>"$venv.lock"
    else
        make_venv
    fi || { echo "1..0 # SKIP pycocotools cannot be installed here (see $venv.log)"; exit 77; }
    PYC=$venv/bin/python
fi
"$PYC" -c "import pycocotools.coco, numpy" >/dev/null 2>&1 ||
    { echo "1..0 # SKIP pycocotools not importable by $PYC"; exit 77; }

T=$(mktemp -d "${TMPDIR:-/tmp}/ps-pycoco.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
bail() { echo "not ok 1 - $1"; [ -f "$2" ] && sed 's/^/# /' "$2" | tail -n 20; echo "1..1"; exit 1; }

"$top_builddir/psdata" gen-det --out "$T/ds" --images 6 --val-images 6 --size 64 --classes 6 \
    --masks --seed 4 >"$T/gen.out" 2>&1 || bail "psdata gen-det --masks" "$T/gen.out"
VJ=$T/ds/annotations/instances_val.json
for gt in "$VJ" "$top_srcdir/tests/golden/coco_segm_gt.json"; do
    n=$(basename "$gt" .json)
    "$top_builddir/tests/tools/coco_results" "$gt" "$T/$n.res.json" >"$T/$n.stats" 2>"$T/$n.err" ||
        bail "coco_results $gt" "$T/$n.err"
done

# train_eval DIR KEY MODEL STEPS SPLIT [psworker flags...]: --model MODEL
# trained STEPS steps (lr 0.01 for 3, 0.02 for more) on the train split into
# DIR, evaluated on SPLIT with --predictions DIR/pred.json, its final line in
# DIR/eval.out carrying KEY (an untrained detector scores ~0.01 everywhere:
# --score-thresh 0.001 keeps detections)
train_eval() {
    local d=$1 key=$2 m=$3 steps=$4 split=$5 lr=0.01
    shift 5
    [ "$steps" -gt 3 ] && lr=0.02
    set -- --model "$m" "$@"
    timeout 300 "$top_builddir/psworker" --standalone "$@" --batch 2 --steps "$steps" --lr $lr \
        --train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train" \
        --out "$d" >"$d.train.out" 2>&1 || bail "psworker training ($m)" "$d.train.out"
    timeout 120 "$top_builddir/psworker" --eval "$@" --weights "$d/model.safetensors" \
        --val-json "$T/ds/annotations/instances_$split.json" --val-root "$T/ds/$split" \
        --predictions "$d/pred.json" \
        >"$d/eval.out" 2>&1 || bail "psworker --eval --predictions ($m)" "$d/eval.out"
    [ -s "$d/pred.json" ] && [ -n "$(fv "$d" "$key")" ] ||
        bail "psworker wrote no predictions ($m) or no $key" "$d/eval.out"
}
fv() { sed -n "s/^final:.* $2=\([^ ]*\).*/\1/p" "$1/eval.out"; } # DIR KEY
COMMON=(--width 8 --fpn-channels 16 --size 64 --freeze-at 0 --threads 1 --loader-threads 1
        --score-thresh 0.001 --log-level warn --progress-every 0)
train_eval "$T/run" map retinanet-r18 3 val "${COMMON[@]}"
# Mask R-CNN: the file carries its masks, scored by pycocotools as segm too.
# 400 steps on the 6 training images, evaluated on them, so that the mask
# AP and AP50 are above zero (about 5 s here; 3 steps segmented nothing and
# the comparison was 0 against 0)
TJ=$T/ds/annotations/instances_train.json
train_eval "$T/mrun" segm_map maskrcnn-r18 400 train --box-head-dim 32 --box-batch 32 \
    --mask-head-dim 8 "${COMMON[@]}"

"$PYC" "$top_srcdir/tests/tools/check_coco_pycocotools.py" \
    --dataset "$VJ" --dataset "$T/ds/annotations/instances_train.json" \
    --results "$VJ" "$T/instances_val.res.json" "$T/instances_val.stats" \
    --results "$top_srcdir/tests/golden/coco_segm_gt.json" "$T/coco_segm_gt.res.json" \
        "$T/coco_segm_gt.stats" \
    --ap "$VJ" "$T/run/pred.json" "$(fv "$T/run" map)" "$(fv "$T/run" ap50)" "$(fv "$T/run" ap75)" \
    --ap "$TJ" "$T/mrun/pred.json" "$(fv "$T/mrun" map)" "$(fv "$T/mrun" ap50)" \
        "$(fv "$T/mrun" ap75)" \
    --segm-ap "$TJ" "$T/mrun/pred.json" "$(fv "$T/mrun" segm_map)" "$(fv "$T/mrun" segm_ap50)" \
        "$(fv "$T/mrun" segm_ap75)"
