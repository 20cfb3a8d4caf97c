#!/usr/bin/env bash
# Detection data with masks on bad input, through the binaries: psdata
# gen-det --masks and check-det; malformed segmentations (odd coordinates,
# two points, points outside the image, RLE counts not summing to h*w, bad
# characters, a size that is not the image's) are errors naming the file,
# the record and its id (exit 1, never a signal) or, with --skip-bad,
# counted skips; a training set with a crowd-only image, an image without
# objects, degenerate boxes and a polygon on the image's edge trains with
# a finite loss and evaluates; psworker names a malformed segmentation and
# trains past it with --skip-bad.  TAP output.
top_builddir=${top_builddir:-.}
PSDATA=$top_builddir/psdata
PSW=$top_builddir/psworker
[ -x "$PSDATA" ] && [ -x "$PSW" ] || { echo "1..0 # SKIP psdata / psworker not built"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/test_det_data_bad.XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
n=0 failed=0
check() { # description, status
    n=$((n + 1))
    if [ "$2" -eq 0 ]; then echo "ok $n - $1"; else echo "not ok $n - $1"; failed=$((failed + 1)); fi
}
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
show() { sed 's/^/#   /' "$T/err" | tail -n 5; }

run "$PSDATA" gen-det --out "$T/ds" --images 6 --val-images 3 --size 64 --classes 6 --masks --seed 8
check "gen-det --masks: 6 + 3 images" $([ $rc -eq 0 ] && [ -f "$T/ds/annotations/instances_val.json" ]; echo $?)
# an output folder whose parents do not exist yet (local-cluster.sh's
# data/det on a fresh clone), and one that cannot be made
run "$PSDATA" gen-det --out "$T/new/data/det" --images 2 --val-images 1 --size 64 --classes 2 --seed 8
check "gen-det makes the output folder's parents" \
    $([ $rc -eq 0 ] && [ -f "$T/new/data/det/annotations/instances_train.json" ]; echo $?)
: >"$T/plainfile"
run "$PSDATA" gen-det --out "$T/plainfile/det" --images 2 --val-images 1 --size 64 --classes 2 --seed 8
check "gen-det under a plain file: exit 1 naming the folder" \
    $([ $rc -eq 1 ] && grep -q "plainfile/det: cannot create directory" "$T/err"; echo $?)
run "$PSDATA" check-det --json "$T/ds/annotations/instances_train.json" --root "$T/ds/train"
check "check-det: every image and mask decodes ($(cat "$T/out"))" \
    $([ $rc -eq 0 ] && grep -q "images=6 .*no_segmentation=0 empty_masks=0 .*bad=0" "$T/out"; echo $?)

# one annotation on image 1 (64 x 64) with a given segmentation
ann() { # SEGMENTATION -> $T/one.json
    printf '{"images":[{"id":1,"file_name":"000001.jpg","width":64,"height":64}],
"annotations":[{"id":41,"image_id":1,"category_id":1,"bbox":[10,10,20,20],"segmentation":%s},
{"id":42,"image_id":1,"category_id":1,"bbox":[40,40,9,9],"segmentation":[[40,40,49,40,49,49,40,49]]}],
"categories":[{"id":1,"name":"circle"}]}\n' "$1" >"$T/one.json"
}
i=0
while IFS='|' read -r segm want; do
    i=$((i + 1))
    ann "$segm"
    run "$PSDATA" check-det --json "$T/one.json" --root "$T/ds/train"
    check "bad segmentation $i: exit 1 naming file, record and id: $want" \
        $([ $rc -eq 1 ] && grep -qF "one.json: annotations[0] (id 41).segmentation" "$T/err" &&
          grep -qF "$want" "$T/err"; echo $?)
    [ $rc -eq 1 ] || show
    run "$PSDATA" check-det --json "$T/one.json" --root "$T/ds/train" --skip-bad
    check "bad segmentation $i with --skip-bad: skipped and counted" \
        $([ $rc -eq 0 ] && grep -q "annotations=1 .*skipped_records=1 bad=0" "$T/out"; echo $?)
done <<'CASES'
[[10,10,30,10,30]]|odd number of coordinates (5)
[[10,10,30,30]]|2 points, a polygon needs at least 3
[[10,10,90,10,30,30]]|x = 90 of point 1 outside the image (64x64)
[[10,10,30,10,30,-9]]|y = -9 of point 2 outside the image
{"size":[64,64],"counts":[100,20,3000]}|counts sum to 3120, not 64*64 = 4096
{"size":[64,64],"counts":"0a~"}|bad character 0x7e at offset 2
{"size":[64,64],"counts":"Pa"}|cut off at the end
{"size":[32,64],"counts":[2048]}|[32, 64] is not the image's [64, 64]
{"size":[64,64]}|needs 'size' and 'counts'
"M"|neither polygons
CASES

# a training set that is awkward but valid: image 2 crowd only, image 3
# without objects, a zero-width box, a polygon half a pixel past the edge
cat >"$T/odd.json" <<'EOF'
{"images":[{"id":1,"file_name":"000001.jpg","width":64,"height":64},
{"id":2,"file_name":"000002.jpg","width":64,"height":64},
{"id":3,"file_name":"000003.jpg","width":64,"height":64},
{"id":4,"file_name":"000004.jpg","width":64,"height":64}],
"annotations":[
{"id":1,"image_id":1,"category_id":1,"bbox":[10,10,20,20],"segmentation":[[10,10,30,10,30,30,10,30]]},
{"id":2,"image_id":1,"category_id":2,"bbox":[50,0,14,14],"segmentation":[[50,-0.5,64.5,-0.5,64.5,14,50,14]]},
{"id":3,"image_id":2,"category_id":1,"bbox":[0,0,64,64],"iscrowd":1,"segmentation":{"size":[64,64],"counts":[0,4096]}},
{"id":4,"image_id":4,"category_id":2,"bbox":[5,5,0,10],"segmentation":[[5,5,5,15,5,10]]},
{"id":5,"image_id":4,"category_id":2,"bbox":[20,20,30,30],"segmentation":{"size":[64,64],"counts":"dX1n0R1000000000000000000000000000000000000000000000000000000000\\k0"}}],
"categories":[{"id":1,"name":"circle"},{"id":2,"name":"square"}]}
EOF
run "$PSDATA" check-det --json "$T/odd.json" --root "$T/ds/train"
check "awkward set: loads ($(cat "$T/out"))" \
    $([ $rc -eq 0 ] && grep -q "crowd=1 polygons=3 rle=2 .*empty_masks=1 images_without_instances=2 .*bad=0" "$T/out"; echo $?)
[ $rc -eq 0 ] || show
MODEL=(--model retinanet-r18 --width 8 --fpn-channels 16 --size 64 --freeze-at 0 --threads 1
       --loader-threads 1 --lr 0.01 --score-thresh 0.001 --progress-every 0)
run timeout 60 "$PSW" --standalone "${MODEL[@]}" --batch 2 --steps 2 --train-json "$T/odd.json" \
    --root "$T/ds/train" --val-json "$T/odd.json" --val-root "$T/ds/train" --predictions "$T/p.json"
loss=$(sed -n 's/^final:.* loss=\([^ ]*\).*/\1/p' "$T/out")
mp=$(sed -n 's/^final:.* map=\([^ ]*\).*/\1/p' "$T/out")
check "psworker trains on it (2 of 4 images: crowd-only and empty left out), loss=$loss map=$mp" \
    $([ $rc -eq 0 ] && grep -q "2 images, 2 classes (2 without boxes left out" "$T/err" &&
      [ -n "$loss" ] && [ "$loss" = "$(printf '%s' "$loss" | tr -d 'na')" ] && [ -n "$mp" ]; echo $?)
[ $rc -eq 0 ] || show
check "the validation's predictions written as a COCO results file" \
    $(grep -q '^\[{"image_id":' "$T/p.json"; echo $?)

ann '[[10,10,30,10,30]]'
run timeout 30 "$PSW" --standalone "${MODEL[@]}" --batch 1 --steps 1 --train-json "$T/one.json" \
    --root "$T/ds/train"
check "psworker on a malformed segmentation: exit $rc naming file and annotation" \
    $({ [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && grep -qF "one.json: annotations[0] (id 41).segmentation[0]: odd" "$T/err"; echo $?)
run timeout 30 "$PSW" --standalone "${MODEL[@]}" --batch 1 --steps 1 --train-json "$T/one.json" \
    --root "$T/ds/train" --skip-bad
check "--skip-bad trains past it, counted in the start-up line" \
    $([ $rc -eq 0 ] && grep -q "1 bad records skipped" "$T/err"; echo $?)
run timeout 30 "$PSW" --standalone "${MODEL[@]}" --batch 1 --steps 1 --train-json "$T/odd.json" \
    --root "$T/ds/train" --predictions "$T/p2.json"
check "--predictions without --val-json: a usage error naming both" \
    $([ $rc -eq 2 ] && grep -q -- "--predictions .*--val-json" "$T/err"; echo $?)

echo "1..$n"
[ "$failed" -eq 0 ]
