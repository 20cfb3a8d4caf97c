#!/usr/bin/env bash
# Detector training through psd: psdata gen-det writes a COCO
# dataset; 2 psd + 2 psworker train a (narrow) RetinaNet-ResNet-18-FPN for a
# few sync steps with a periodic COCO validation; the final: line carries
# map= ap50= ap75=; rank 0's export evaluated by psworker --eval gives rank
# 0's own numbers; one worker through psd equals --standalone (frozen BN:
# the same arithmetic); bad annotations are a clear error.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

"$PSDATA" gen-det --out "$T/ds" --images 12 --val-images 4 --size 64 --classes 3 --seed 2 \
    >"$T/gen.out" 2>"$T/gen.err"
ok $? "psdata gen-det wrote a 12 + 4 image dataset"
[ -s "$T/ds/annotations/instances_train.json" ] && [ -s "$T/ds/annotations/instances_val.json" ] &&
    [ "$(ls "$T/ds/train" | wc -l)" -eq 12 ] && [ "$(ls "$T/ds/val" | wc -l)" -eq 4 ]
ok $? "COCO layout: annotations/instances_{train,val}.json, 12 train and 4 val JPEGs"
grep -o '"name":"[a-z]*"' "$T/ds/annotations/instances_train.json" | sort -u | tr '\n' ' ' |
    grep -qx '"name":"circle" "name":"square" "name":"triangle" '
ok $? "--classes 3: categories circle, square, triangle"
"$PSDATA" gen-det --out "$T/bad" --classes 9 >/dev/null 2>"$T/badc.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--classes '9'" "$T/badc.err"
ok $? "psdata gen-det --classes 9: exit $rc naming the option"

DATA=(--train-json "$T/ds/annotations/instances_train.json" --root "$T/ds/train"
      --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val")
# width 8, FPN 16 and 64x64 keep a step in milliseconds; one compute and one
# loader thread per worker so two workers share the two cores
# (--score-thresh 0.001: an untrained detector scores ~0.01 everywhere; the
# default 0.05 would leave nothing to evaluate)
MODEL=(--model retinanet-r18 --width 8 --fpn-channels 16 --size 64 --freeze-at 0 --threads 1
       --loader-threads 1 --lr 0.01 --seed 5 --data-seed 9 --score-thresh 0.001)

start_cluster 2 2 --mode sync
ok $? "2 psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" "${DATA[@]}" --batch 2 --steps 4 --val-every 2 \
    --partition-bytes 65536
ok $? "2 workers trained retinanet-r18 for 4 sync steps"
grep -q '^val: iter=2 images=4 map=' "$T/run/w0.out"
ok $? "rank 0 validated at step 2 (COCO evaluation of 4 images)"
for k in map ap50 ap75 images_per_s cluster_images_per_s loss; do
    v=$(final_value "$T/run/w0.out" $k)
    [ -n "$v" ] && [ "$v" != nan ] && [ "$v" != -nan ]
    ok $? "rank 0 final line has $k=$v"
done
[ "$(final_value "$T/run/w0.out" val_images)" = 4 ] && [ "$(final_value "$T/run/w1.out" workers)" = 2 ]
ok $? "final lines: 4 validation images, 2 workers"
[ -s "$T/run/model.safetensors" ]
ok $? "rank 0 wrote model.safetensors"

timeout 50 "$PSW" --eval "${MODEL[@]}" --weights "$T/run/model.safetensors" \
    --val-json "$T/ds/annotations/instances_val.json" --val-root "$T/ds/val" --log-level warn \
    >"$T/eval.out" 2>"$T/eval.err"
ok $? "psworker --eval on the exported detector"
for k in detections map ap50 ap75; do
    a=$(final_value "$T/run/w0.out" $k); b=$(final_value "$T/eval.out" $k)
    [ -n "$a" ] && [ "$a" = "$b" ]
    ok $? "--eval $k=$b equals rank 0's final $k=$a"
done
[ "$(final_value "$T/eval.out" detections)" -gt 0 ]
ok $? "the evaluation saw detections (a non-trivial comparison)"

# one worker through psd == standalone (fp32 wire, frozen BN, same data)
psd_vs_standalone 3 detector "${MODEL[@]}" "${DATA[@]}"

# bad input: clear errors naming the file, exit 1 or 2, no crash
timeout 20 "$PSW" --standalone "${MODEL[@]}" --train-json "$T/none.json" --root "$T/ds/train" \
    --steps 1 >"$T/nf.out" 2>"$T/nf.err"
rc=$?
{ [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && grep -q "none.json" "$T/nf.err"
ok $? "missing annotations: exit $rc naming the file"
sed 's/"bbox":\[[^]]*\]/"bbox":[60,60,30,30]/' "$T/ds/annotations/instances_train.json" >"$T/outside.json"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --train-json "$T/outside.json" --root "$T/ds/train" \
    --steps 1 >"$T/ob.out" 2>"$T/ob.err"
rc=$?
{ [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && grep -q "outside.json: annotations\[0\].bbox.*outside image" "$T/ob.err"
ok $? "boxes outside the image: exit $rc naming the record"
printf 'junk' >"$T/ds/train/000003.jpg"
timeout 30 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" --batch 4 --steps 3 >"$T/bj.out" 2>"$T/bj.err"
rc=$?
[ $rc -eq 1 ] && grep -q "000003.jpg" "$T/bj.err"
ok $? "unreadable image during training: exit $rc naming it"
timeout 30 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" --batch 4 --steps 3 --skip-bad \
    >"$T/sk.out" 2>"$T/sk.err"
ok $? "--skip-bad trains past it"
s=$(final_value "$T/sk.out" skipped)
[ -n "$s" ] && [ "$s" -ge 1 ]
ok $? "the skip is counted in the final line (skipped=$s)"
tap_done
