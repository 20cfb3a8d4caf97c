#!/usr/bin/env bash
# Mask R-CNN training through psd: 2 psd + 2 psworker train a (narrow) Mask
# R-CNN-ResNet-18-FPN on a generated COCO set with instance masks for a few
# sync steps with a COCO validation; the final: line carries map= ap50=
# ap75= and segm_map= segm_ap50= segm_ap75=; rank 0's export evaluated by
# psworker --eval gives rank 0's numbers, boxes and masks; one worker
# through psd equals --standalone.  Bad input for masks in training:
# images with no objects, a crowd-only image and a degenerate box are left
# out or ignored (counted, finite loss); a polygon far outside the image
# and an instance without a segmentation are errors naming the record
# (exit 1), a skipped record with --skip-bad.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

"$PSDATA" gen-det --out "$T/ds" --images 12 --val-images 4 --size 64 --classes 3 --seed 2 \
    --min-objects 1 --max-objects 3 --masks >"$T/gen.out" 2>"$T/gen.err"
ok $? "psdata gen-det --masks wrote a 12 + 4 image dataset"

DATA=(--train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train"
      --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val")
# width 8, FPN 16, a 32-wide box head, an 8-wide mask head and 64x64 keep a
# step in milliseconds (--score-thresh 0.001: an untrained detector's
# class scores sit near 1/4)
MODEL=(--model maskrcnn-r18 --width 8 --fpn-channels 16 --box-head-dim 32 --box-batch 32
       --mask-head-dim 8 --size 64 --freeze-at 0 --threads 1 --loader-threads 1 --lr 0.01
       --seed 5 --data-seed 9 --score-thresh 0.001)

start_cluster 2 2 --mode sync
ok $? "2 psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" "${DATA[@]}" --batch 2 --steps 4 --val-every 2 \
    --partition-bytes 65536
ok $? "2 workers trained maskrcnn-r18 for 4 sync steps"
grep -q '^val: iter=2 images=4 map=.* segm_map=' "$T/run/w0.out"
ok $? "rank 0 validated at step 2 (boxes and masks of 4 images)"
for k in map ap50 ap75 segm_map segm_ap50 segm_ap75 loss; do
    v=$(final_value "$T/run/w0.out" $k)
    [ -n "$v" ] && [ "$v" != nan ] && [ "$v" != -nan ]
    ok $? "rank 0 final line has $k=$v"
done
head -1 "$T/run/val.csv" | grep -q ',segm_map,segm_ap50,segm_ap75$' &&
    [ "$(tail -1 "$T/run/val.csv" | tr ',' '\n' | wc -l)" = 9 ]
ok $? "the validation CSV has the masks' columns"

eval_equals "$T/run/w0.out" "Mask R-CNN (rank 0), with --predictions" \
    "$BOX_KEYS segm_map segm_ap50 segm_ap75" "${MODEL[@]}" --predictions "$T/pred.json" \
    --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val"
grep -q '"segmentation": *{"size": *\[' "$T/pred.json"
ok $? "the predictions carry compressed-RLE segmentations"

psd_vs_standalone 3 "Mask R-CNN" "${MODEL[@]}" "${DATA[@]}"

# bad input.  Image 0 without annotations, image 1 crowd-only, a degenerate
# box (w = 0): left out / ignored, counted, training runs with a finite loss.
# Annotation 2's polygon reaching far outside its image; annotation 3
# without a segmentation.
J=$T/ds/annotations/instances_train.json
MUT=$top_builddir/tests/tools/coco_mutate
{ "$MUT" "$J" "$T/empty.json" empty=0 crowd=1 degenerate=-1 &&
  "$MUT" "$J" "$T/outside.json" outside=2 && "$MUT" "$J" "$T/noseg.json" noseg=3; } ||
    { echo "Bail out! coco_mutate failed"; exit 99; }
R=(--root "$T/ds/train")
train_json em 3 "${MODEL[@]}" --train-json "$T/empty.json" "${R[@]}"
[ $rc -eq 0 ] && grep -q "10 images, 3 classes (2 without boxes left out" "$T/em.err" && finite "$loss"
ok $? "an image without objects and a crowd-only image left out (counted), a degenerate box ignored: trains, loss=$loss"
train_json os 1 "${MODEL[@]}" --train-json "$T/outside.json" "${R[@]}"
[ $rc -eq 1 ] && grep -q 'outside.json: annotations\[2\].*segmentation' "$T/os.err"
ok $? "a polygon far outside the image: exit $rc naming the record"
train_json os2 2 "${MODEL[@]}" --train-json "$T/outside.json" "${R[@]}" --skip-bad
[ $rc -eq 0 ] && grep -q "1 bad records skipped" "$T/os2.err" && finite "$loss"
ok $? "--skip-bad: that record skipped (counted), trains, loss=$loss"
train_json ns 1 "${MODEL[@]}" --train-json "$T/noseg.json" "${R[@]}"
[ $rc -eq 1 ] && grep -qi 'segmentation' "$T/ns.err"
ok $? "a training instance without a segmentation: exit $rc naming it"
tap_done
