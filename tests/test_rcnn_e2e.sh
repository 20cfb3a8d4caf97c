#!/usr/bin/env bash
# Faster R-CNN training through psd: 2 psd + 2 psworker train a (narrow)
# Faster R-CNN-ResNet-18-FPN on a generated COCO set for a few sync steps
# with a periodic COCO validation; the final: line carries map= ap50=
# ap75=; rank 0's export evaluated by psworker --eval gives rank 0's own
# numbers; one worker through psd equals --standalone (frozen BN and the
# step's sampling seed a function of (--seed, step, rank): the same
# arithmetic), Cascade R-CNN too; bad input is a clear error or a counted
# skip.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

"$PSDATA" gen-det --out "$T/ds" --images 12 --val-images 4 --size 64 --classes 3 --seed 2 \
    --min-objects 1 --max-objects 3 >"$T/gen.out" 2>"$T/gen.err"
ok $? "psdata gen-det wrote a 12 + 4 image dataset"

DATA=(--train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train"
      --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val")
# width 8, FPN 16, a 32-wide box head and 64x64 keep a step in
# milliseconds; one compute and one loader thread per worker
# (--score-thresh 0.001: an untrained detector's class scores sit near 1/4)
MODEL=(--model fasterrcnn-r18 --width 8 --fpn-channels 16 --box-head-dim 32 --box-batch 32
       --size 64 --freeze-at 0 --threads 1 --loader-threads 1 --lr 0.01 --seed 5 --data-seed 9
       --score-thresh 0.001)

start_cluster 2 2 --mode sync
ok $? "2 psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" "${DATA[@]}" --batch 2 --steps 4 --val-every 2 \
    --partition-bytes 65536
ok $? "2 workers trained fasterrcnn-r18 for 4 sync steps"
grep -q '^val: iter=2 images=4 map=' "$T/run/w0.out"
ok $? "rank 0 validated at step 2 (COCO evaluation of 4 images)"
for k in map ap50 ap75 images_per_s cluster_images_per_s loss; do
    v=$(final_value "$T/run/w0.out" $k)
    [ -n "$v" ] && [ "$v" != nan ] && [ "$v" != -nan ]
    ok $? "rank 0 final line has $k=$v"
done
grep -q '^final: .* model=fasterrcnn-r18 ' "$T/run/w0.out" &&
    [ "$(final_value "$T/run/w1.out" workers)" = 2 ]
ok $? "final lines: model=fasterrcnn-r18, 2 workers"
[ -s "$T/run/model.safetensors" ]
ok $? "rank 0 wrote model.safetensors"

VAL=(--val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val")
eval_equals "$T/run/w0.out" "Faster R-CNN (rank 0)" "$BOX_KEYS" "${MODEL[@]}" "${VAL[@]}"
[ "$(final_value "$T/run/w0.out.eval" detections)" -gt 0 ]
ok $? "the evaluation saw detections (a non-trivial comparison)"

psd_vs_standalone 3 "Faster R-CNN" "${MODEL[@]}" "${DATA[@]}"

# Cascade R-CNN: the same through psd and standalone, its export's --eval
# equal to its final line, the cascade's names and class count in the file
CASCADE=("${MODEL[@]/fasterrcnn-r18/cascade-r18}")
psd_vs_standalone 3 "Cascade R-CNN" "${CASCADE[@]}" "${DATA[@]}"
mkdir -p "$T/crun"
timeout 60 "$PSW" --standalone "${CASCADE[@]}" "${DATA[@]}" --batch 2 --steps 3 --out "$T/crun" \
    >"$T/crun/train.out" 2>"$T/crun.err"
ok $? "cascade-r18 trained 3 steps with validation"
eval_equals "$T/crun/train.out" "Cascade R-CNN" "$BOX_KEYS" "${CASCADE[@]}" "${VAL[@]}"
timeout 20 "$PSW" --eval "${MODEL[@]}" --weights "$T/crun/model.safetensors" \
    --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val" >"$T/cx.out" 2>"$T/cx.err"
rc=$?
[ $rc -ne 0 ] && grep -q "box_predictor" "$T/cx.err"
ok $? "a Cascade R-CNN checkpoint as --model fasterrcnn-r18: exit $rc naming the tensors"

# bad input: clear errors, exit 1 or 2, no crash
timeout 20 "$PSW" --standalone "${MODEL[@]/fasterrcnn-r18/fasterrcnn-r19}" "${DATA[@]}" \
    --steps 1 >"$T/bm.out" 2>"$T/bm.err"
rc=$?
[ $rc -eq 2 ] && grep -q "fasterrcnn-r19" "$T/bm.err"
ok $? "--model fasterrcnn-r19: exit $rc naming it"
timeout 20 "$PSW" "${MODEL[@]}" --export-onnx "$T/x.onnx" --num-classes 3 >"$T/ox.out" 2>"$T/ox.err"
rc=$?
[ $rc -eq 2 ] && grep -q "export-onnx.*fasterrcnn-r18" "$T/ox.err" && [ ! -e "$T/x.onnx" ]
ok $? "--export-onnx of Faster R-CNN: exit $rc naming it (no graph yet), no file written"
timeout 20 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" --batch 4 --steps 2 --max-gt 1 \
    >"$T/mg.out" 2>"$T/mg.err"
rc=$?
[ $rc -eq 1 ] && grep -q "instances, more than max_instances 1" "$T/mg.err"
ok $? "an image with more boxes than --max-gt: exit $rc naming it"
# every box of image 1 crowd, one box of another image degenerate (w = 0):
# the crowd-only image leaves the training set (counted), the empty box is no target
"$top_builddir/tests/tools/coco_mutate" "$T/ds/annotations/instances_train.json" "$T/crowd.json" \
    crowd=0 degenerate=-1 ||
    { echo "Bail out! coco_mutate failed"; exit 99; }
train_json cr 3 "${MODEL[@]}" --train-json "$T/crowd.json" --root "$T/ds/train"
[ $rc -eq 0 ] && grep -q "11 images, 3 classes (1 without boxes left out" "$T/cr.err" && finite "$loss"
ok $? "a crowd-only image left out (counted), a degenerate box ignored: trains, loss=$loss"
grep -q 'Faster R-CNN: RPN pre / post NMS 160 / 160 training, 80 / 80 test' "$T/cr.err"
ok $? "RPN counts scaled to 64 pixels (torchvision's 2000 / 1000 x 64/800)"
tap_done
