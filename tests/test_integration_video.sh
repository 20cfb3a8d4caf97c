#!/usr/bin/env bash
# Video training through psd: 2 psd + 2 psworker train a (narrow) TSM
# ResNet-18 on a generated direction dataset, validate, export; the export
# evaluated by psworker --eval gives rank 0's own numbers; one worker through
# psd (fp32 wire) equals --standalone; bad data is a clear error.
#
# The W workers x batch B == one worker x W*B weight property needs BN frozen
# (per-worker batch statistics differ otherwise): tests/test_integration_bn_frozen.sh
# checks it with --bn frozen; the data half of it (same samples, same pixels)
# is checked in tests/test_video_data.c.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

"$PSDATA" gen-video --out "$T/ds" --videos 24 --frames 8 --size 32 --seed 2 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 24-video dataset"
DATA=(--train-list "$T/ds/train.txt" --val-list "$T/ds/val.txt" --root "$T/ds")
# width 8 and 32x32 keep a step in milliseconds; one compute and one loader
# thread each so two workers share the two cores politely
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --lr 0.01 --momentum 0.9 --seed 5 --data-seed 9)

start_cluster 2 2 --mode sync
ok $? "2 psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" "${DATA[@]}" --batch 2 --steps 6 --val-every 3 \
    --partition-bytes 65536
ok $? "2 workers trained tsm-r18 for 6 sync steps"
f0=$(grep '^final:' "$T/run/w0.out")
for k in top1 top5 clips_per_s data_wait_ms compute_ms comm_wait_ms; do
    v=$(final_value "$T/run/w0.out" $k)
    [ -n "$v" ] && [ "$v" != nan ]
    ok $? "rank 0 final line has $k=$v"
done
[ -s "$T/run/model.safetensors" ]
ok $? "rank 0 wrote model.safetensors"
head -n 1 "$T/run/metrics-rank1.csv" | grep -q 'data_wait_ms' && [ "$(csv_rows "$T/run/metrics-rank1.csv")" -eq 6 ]
ok $? "rank 1 CSV: 6 iterations with a data_wait_ms column"
[ "$(csv_rows "$T/run/val.csv")" -eq 2 ]
ok $? "periodic validation at step 3 and the final one in val.csv"

timeout 50 "$PSW" --eval "${MODEL[@]}" --weights "$T/run/model.safetensors" --val-list "$T/ds/val.txt" \
    --root "$T/ds" --log-level warn >"$T/eval.out" 2>"$T/eval.err"
ok $? "psworker --eval on the exported model"
for k in top1 top5 val_loss; do
    a=$(final_value "$T/run/w0.out" $k); b=$(final_value "$T/eval.out" $k)
    [ -n "$a" ] && [ "$a" = "$b" ]
    ok $? "--eval $k=$b equals rank 0's final $k=$a"
done

# one worker through psd == standalone (fp32 wire; same data, same BN batches)
psd_vs_standalone 4 "weights (and BN statistics)" "${MODEL[@]}" "${DATA[@]}"

# bad data: clear error naming the list file and line, exit 1
printf 'vid_000000 8 0\nvid_000001 eight 1\n' >"$T/bad.txt"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --train-list "$T/bad.txt" --root "$T/ds" --steps 1 \
    >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc -eq 1 ] && grep -q "bad.txt:2: num_frames 'eight'" "$T/bad.err"
ok $? "bad list: exit $rc naming bad.txt:2"
printf 'junk' >"$T/ds/vid_000003/img_00002.jpg"
timeout 20 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" --batch 4 --steps 5 >"$T/badj.out" 2>"$T/badj.err"
rc=$?
[ $rc -eq 1 ] && grep -q "train.txt:4: video 'vid_000003'.*img_00002.jpg" "$T/badj.err"
ok $? "bad JPEG during training: exit $rc naming train.txt:4 and the frame"
timeout 20 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" --batch 4 --steps 5 --skip-bad \
    >"$T/skip.out" 2>"$T/skip.err"
ok $? "--skip-bad trains past the bad frame"
tap_done
