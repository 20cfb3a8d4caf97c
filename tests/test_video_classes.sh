#!/usr/bin/env bash
# The video task's class count against the lists' labels: with --num-classes
# N a label >= N (train or val list, folder or packed) is a usage error
# (exit 2) naming the list, the line and the label, before any training;
# without it the count comes from the data (largest label + 1), is logged,
# and the labels must be 0..K-1 without gaps.  Negative labels are refused
# by the list reader.  TAP output; 77 (skip) until psworker and psdata are
# built.
set -u
top_builddir=${top_builddir:-.}
PSW=$top_builddir/psworker
PSDATA=$top_builddir/psdata
for b in "$PSW" "$PSDATA"; do
    [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done

. "$(dirname "$0")/lib/tap_lib.sh" || { echo "Bail out! cannot read lib/tap_lib.sh"; exit 99; }
tap_lib_init video_classes

"$PSDATA" gen-video --out "$T/ds" --videos 12 --frames 4 --size 32 --seed 2 --classes 4 \
    >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 12-video dataset with labels 0..3"
# 10 train videos (labels 0..3), 2 val; the same list with one label 7 added
cp "$T/ds/train.txt" "$T/t7.txt"
echo "vid_000000 4 7" >>"$T/t7.txt"
line7=$(wc -l <"$T/t7.txt")
printf 'vid_000000 4 0\nvid_000001 4 1\nvid_000002 4 2\nvid_000003 4 7\n' >"$T/gap.txt"
printf 'vid_000000 4 0\nvid_000001 4 -1\n' >"$T/neg.txt"
"$PSDATA" pack --list "$T/t7.txt" --root "$T/ds" --out "$T/pk7" >/dev/null 2>"$T/pack.err"
ok $? "psdata pack of the list with label 7"

# one standalone step, tiny model: the runs that pass train for milliseconds
M=(--standalone --model tsm-r18 --width 8 --size 32 --frames 4 --threads 1 --loader-threads 1
   --batch 2 --steps 1 --root "$T/ds" --log-level info)
trained() { grep -q '^final:' "$T/$1.out"; }

run given_train timeout 60 "$PSW" "${M[@]}" --num-classes 4 --train-list "$T/t7.txt" \
    --val-list "$T/ds/val.txt"
[ $rc = 2 ] && grep -qF "t7.txt:$line7: label 7 is outside --num-classes 4" "$T/given_train.out" &&
    ! trained given_train
ok $? "--num-classes 4, label 7 in the train list: exit $rc naming t7.txt:$line7 and label 7, no training"
[ $rc = 2 ] || show "$T/given_train.out"

run given_val timeout 60 "$PSW" "${M[@]}" --num-classes 4 --train-list "$T/ds/train.txt" \
    --val-list "$T/t7.txt"
[ $rc = 2 ] && grep -qF "t7.txt:$line7: label 7 is outside --num-classes 4" "$T/given_val.out" &&
    ! trained given_val
ok $? "--num-classes 4, label 7 in the val list: exit $rc naming t7.txt:$line7"

run given_packed timeout 60 "$PSW" "${M[@]}" --num-classes 4 --packed --train-list "$T/pk7"
[ $rc = 2 ] && grep -qF "pk7 (list line $line7): label 7 is outside --num-classes 4" \
    "$T/given_packed.out" && ! trained given_packed
ok $? "--num-classes 4, label 7 in a packed list: exit $rc naming the pack and list line $line7"

run gap timeout 60 "$PSW" "${M[@]}" --train-list "$T/gap.txt"
[ $rc = 2 ] && grep -q "labels are not 0\.\.7: no video has label 3, yet .*gap.txt:4 has label 7" \
    "$T/gap.out" && grep -qF -- "--num-classes 8" "$T/gap.out" && ! trained gap
ok $? "labels {0,1,2,7} from the data: exit $rc naming the gap, gap.txt:4 and --num-classes 8"
[ $rc = 2 ] || show "$T/gap.out"

run gap_tail timeout 60 "$PSW" "${M[@]}" --train-list "$T/t7.txt" --val-list "$T/ds/val.txt"
[ $rc = 2 ] && grep -q "no video has label 4, yet .*t7.txt:$line7 has label 7" "$T/gap_tail.out"
ok $? "labels 0..3 plus one 7 from the data: exit $rc, not an 8-class model"

run gap_given timeout 60 "$PSW" "${M[@]}" --train-list "$T/gap.txt" --num-classes 8
[ $rc = 0 ] && grep -q "8 classes (--num-classes)" "$T/gap_given.out" &&
    grep -q "8 classes, T=4" "$T/gap_given.out" && trained gap_given
ok $? "the same gap with --num-classes 8 given: trains an 8-class model (rc $rc)"

run data timeout 60 "$PSW" "${M[@]}" --train-list "$T/ds/train.txt" --val-list "$T/ds/val.txt"
[ $rc = 0 ] && grep -q "4 classes from the data: labels 0\.\.3 in .*train.txt and .*val.txt" \
    "$T/data.out" && trained data
ok $? "labels 0..3 from the data: 4 classes, logged with the lists they came from (rc $rc)"
[ $rc = 0 ] || show "$T/data.out"

run given_ok timeout 60 "$PSW" "${M[@]}" --train-list "$T/ds/train.txt" --num-classes 6
[ $rc = 0 ] && grep -q "6 classes, T=4" "$T/given_ok.out" && trained given_ok
ok $? "--num-classes 6 above the labels 0..3: allowed (classes without videos), rc $rc"

run neg timeout 60 "$PSW" "${M[@]}" --train-list "$T/neg.txt" --num-classes 4
[ $rc != 0 ] && [ $rc -lt 128 ] && grep -qF "neg.txt:2: label '-1' is not a non-negative integer" \
    "$T/neg.out"
ok $? "a negative label is refused by the list reader, naming neg.txt:2 (rc $rc)"

run one timeout 60 "$PSW" "${M[@]}" --train-list "$T/ds/train.txt" --num-classes 1
[ $rc = 2 ]
ok $? "--num-classes 1: exit $rc"

echo "1..$n"
[ "$fails" = 0 ]
