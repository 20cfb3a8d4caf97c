#!/usr/bin/env bash
# From a folder of video files and a label CSV to a trained TSM and its val
# top-1, as docs/video.md tells a user: psdata gen-video --container mp4
# (the folder and a Kinetics-style labels.csv), psdata csv-lists, psdata
# extract, then 1 psd + 2 psworker on the extracted frames; the same data
# decoded on the fly (--video-list) through 1 psd + 1 psworker; --eval on
# the video files with class names in --predictions; straight into shards.
# Bad input: a truncated mp4, a text file named .mp4, a missing file: each
# named with its list line, counted, left out, nothing half-written; the
# loader names them too.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

V=$T/videos
"$PSDATA" gen-video --container mp4 --out "$V" --videos 24 --frames 12 --size 32 --seed 2 >/dev/null 2>"$T/gen.err"
ok $? "gen-video wrote 24 mp4 files and labels.csv" || show_log "$T/gen.err"
"$PSDATA" csv-lists --csv "$V/labels.csv" --class-names "$V/classes.txt" --root "$V" --out "$T/lists" \
    >"$T/csv.out" 2>"$T/csv.err"
ok $? "csv-lists: $(cat "$T/csv.out")" || show_log "$T/csv.err"
[ "$(wc -l <"$T/lists/train.txt")" -eq 19 ] && [ "$(wc -l <"$T/lists/val.txt")" -eq 5 ] &&
    grep -q '^vid_000001_000000_000001.mp4 1$' "$T/lists/train.txt"
ok $? "lists: 19 train + 5 val videos, 'path label' with the class file's indices"
for s in train val; do
    "$PSDATA" extract --list "$T/lists/$s.txt" --root "$V" --out "$T/frames" --short-side 32 --threads 2 \
        >"$T/ex-$s.out" 2>"$T/ex-$s.err"
    ok $? "extract $s: $(cat "$T/ex-$s.out")" || show_log "$T/ex-$s.err"
done
head -n 1 "$T/frames/train.txt" | grep -q '^vid_000000_000000_000001 12 0$' &&
    [ -f "$T/frames/vid_000000_000000_000001/img_00012.jpg" ]
ok $? "frames/train.txt in the TSM format, 12 frames per folder"

# a run killed (SIGKILL) once a few videos are done, then run again: every
# folder under its final name is whole, the list appears only at the end,
# the second run redoes only what the first did not finish
"$PSDATA" extract --list "$T/lists/train.txt" --root "$V" --out "$T/killed" --short-side 32 --threads 1 \
    >/dev/null 2>"$T/kill.err" &
xp=$!
PIDS+=("$xp")
for _ in $(seq 1 200); do
    [ "$(find "$T/killed" -name .frames 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.02
done
kill -KILL "$xp" 2>/dev/null
wait "$xp" 2>/dev/null
unset 'PIDS[-1]' # reaped: its number may belong to another process by the cleanup
whole=1
for d in "$T"/killed/vid_*; do
    case $d in *.extracting) continue ;; esac
    [ -d "$d" ] || continue
    [ "$(ls "$d"/img_*.jpg | wc -l)" -eq 12 ] && [ "$(cat "$d/.frames")" = 12 ] || whole=0
done
# a marker inside NAME.extracting is a folder not yet renamed: not done
done_first=$(find "$T/killed" -path '*.extracting' -prune -o -name .frames -print | wc -l)
[ $whole = 1 ] && { [ ! -f "$T/killed/train.txt" ] || [ "$done_first" -eq 19 ]; }
ok $? "killed after $done_first of 19 videos: each finished folder whole, no list yet"
"$PSDATA" extract --list "$T/lists/train.txt" --root "$V" --out "$T/killed" --short-side 32 --threads 1 \
    >"$T/resume.out" 2>"$T/resume.err"
rc=$?
[ $rc -eq 0 ] && grep -q "$((19 - done_first)) extracted .* $done_first done before, 0 bad" "$T/resume.out" &&
    cmp -s "$T/killed/train.txt" "$T/frames/train.txt" && ! ls -d "$T"/killed/*.extracting >/dev/null 2>&1
ok $? "run again: $(cat "$T/resume.out"); the list equals an uninterrupted run's"

MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --lr 0.01 --momentum 0.9 --seed 5 --data-seed 9 --batch 2)
start_cluster 1 2 --mode sync
ok $? "1 psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" --train-list "$T/frames/train.txt" --val-list "$T/frames/val.txt" \
    --root "$T/frames" --steps 6
ok $? "2 workers trained TSM on the extracted frames"
t1=$(final_value "$T/run/w0.out" top1)
[ -n "$t1" ] && [ "$t1" != nan ]
ok $? "extracted frames: val top1=$t1 printed"

for p in $(live_pids); do kill -TERM "$p" 2>/dev/null; done
start_cluster 1 1 --mode sync
ok $? "1 psd for one worker"
run_workers 1 "$T/fly" "${MODEL[@]}" --video-list "$T/lists/train.txt" --val-video-list "$T/lists/val.txt" \
    --root "$V" --short-side 32 --steps 6 --val-every 3
ok $? "1 worker trained TSM decoding the mp4 files on the fly"
t2=$(final_value "$T/fly/w0.out" top1)
[ -n "$t2" ] && [ "$t2" != nan ] && [ "$(csv_rows "$T/fly/val.csv")" -eq 2 ]
ok $? "on the fly: val top1=$t2 printed, periodic validation in val.csv"

timeout 50 "$PSW" --eval "${MODEL[@]}" --weights "$T/run/model.safetensors" --val-video-list "$T/lists/val.txt" \
    --root "$V" --short-side 32 --predictions "$T/pred.csv" --class-names "$V/classes.txt" --log-level warn \
    >"$T/eval.out" 2>"$T/eval.err"
ok $? "--eval on the video files" || show_log "$T/eval.err"
head -n 1 "$T/pred.csv" | grep -q ',label_name,pred_name$' && [ "$(wc -l <"$T/pred.csv")" -eq 6 ] &&
    sed -n 2p "$T/pred.csv" | grep -q '"moving [a-z ]*","moving [a-z ]*"$'
ok $? "--predictions rows end with the label's and the prediction's class names"
timeout 50 "$PSW" --eval "${MODEL[@]}" --weights "$T/run/model.safetensors" --val-list "$T/frames/val.txt" \
    --root "$T/frames" --log-level warn >"$T/evalf.out" 2>"$T/evalf.err"
ok $? "--eval on the extracted frames: top1=$(final_value "$T/evalf.out" top1), on the fly top1=$(final_value "$T/eval.out" top1)"

for s in train val; do
    "$PSDATA" extract --list "$T/lists/$s.txt" --root "$V" --packed "$T/packs/$s" --short-side 32 \
        --shard-videos 8 >"$T/pk-$s.out" 2>"$T/pk-$s.err"
    ok $? "extract $s into shards: $(cat "$T/pk-$s.out")" || show_log "$T/pk-$s.err"
done
standalone "$T/packed" "${MODEL[@]}" --packed --train-list "$T/packs/train" --val-list "$T/packs/val" --steps 2
ok $? "psworker --packed trains on the extracted shards (top1=$(final_value "$T/packed/w0.out" top1))"

# bad input
head -c 2000 "$V/vid_000003_000000_000001.mp4" >"$V/cut.mp4"
echo "not a video" >"$V/text.mp4"
{ head -n 2 "$T/lists/train.txt"; echo "cut.mp4 1"; echo "text.mp4 2"; echo "gone.mp4 3"; } >"$T/bad.txt"
"$PSDATA" extract --list "$T/bad.txt" --root "$V" --out "$T/badout" --short-side 32 >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc -eq 1 ] && grep -q '2 extracted.* 3 bad' "$T/bad.out"
ok $? "extract of a list with 3 bad videos: exit $rc, $(cat "$T/bad.out")"
grep -q "bad.txt:3: video 'cut.mp4'.*cut.mp4" "$T/bad.err" && grep -q "bad.txt:4: video 'text.mp4'" "$T/bad.err" &&
    grep -q "bad.txt:5: video 'gone.mp4'.*No such file" "$T/bad.err"
ok $? "each bad video named with its list line and file" || show_log "$T/bad.err"
[ "$(wc -l <"$T/badout/bad.txt")" -eq 2 ] && ! ls -d "$T"/badout/*.extracting "$T"/badout/cut "$T"/badout/text \
    >/dev/null 2>&1
ok $? "the list holds the 2 good videos; no folder, whole or half, of a bad one"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --video-list "$T/bad.txt" --root "$V" --steps 1 \
    >"$T/badw.out" 2>"$T/badw.err"
rc=$?
[ $rc -eq 1 ] && grep -q "bad.txt:3: video 'cut.mp4'" "$T/badw.err"
ok $? "psworker --video-list with a truncated mp4: exit $rc naming bad.txt:3" || show_log "$T/badw.err"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --video-list "$T/bad.txt" --root "$V" --steps 1 --skip-bad \
    >"$T/skipw.out" 2>"$T/skipw.err"
ok $? "--skip-bad trains on the good videos" || show_log "$T/skipw.err"
grep -q "3 bad entries skipped" "$T/skipw.err"
ok $? "--skip-bad counts the 3 skipped videos"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --video-list "$T/bad.txt" --train-list "$T/frames/train.txt" \
    --root "$V" --steps 1 >/dev/null 2>"$T/both.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--video-list" "$T/both.err"
ok $? "--video-list with --train-list: usage error (exit $rc)"
printf 'label,youtube_id,time_start,time_end,split\nflying,vid_000000,0,1,train\n' >"$T/unknown.csv"
"$PSDATA" csv-lists --csv "$T/unknown.csv" --class-names "$V/classes.txt" --root "$V" --out "$T/l2" \
    >/dev/null 2>"$T/unk.err"
rc=$?
[ $rc -ne 0 ] && grep -q "unknown.csv:2: label 'flying'" "$T/unk.err"
ok $? "csv-lists: a label not in the class file: exit $rc naming unknown.csv:2"
tap_done
