#!/bin/sh
# psdata on bad input: clear messages naming file and line, non-zero exit,
# never a crash (exit codes >= 128 mean a signal); plus gen-video, pack and
# check round trip through the binary.  TAP output.
top_builddir=${top_builddir:-.}
PSDATA="$top_builddir/psdata"
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
T=$(mktemp -d /tmp/test_video_data_bad.XXXXXX)
trap 'rm -rf "$T"' EXIT INT TERM
n=0; failed=0
check() { # description, condition-status
    n=$((n + 1))
    if [ "$2" -eq 0 ]; then echo "ok $n - $1"; else echo "not ok $n - $1"; failed=$((failed + 1)); fi
}
# run CMD...: captures stderr in $T/err, exit code in $rc
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }

run "$PSDATA" --help
check "psdata --help exits 0" $([ $rc -eq 0 ] && grep -q gen-video "$T/out"; echo $?)
run "$PSDATA" gen-video --out "$T/ds" --videos 12 --frames 9 --size 24 --seed 4 --classes 4
check "gen-video writes a dataset" $([ $rc -eq 0 ] && [ -f "$T/ds/train.txt" ] && [ -f "$T/ds/val.txt" ]; echo $?)
lines=$(cat "$T/ds/train.txt" "$T/ds/val.txt" | wc -l)
frames=$(ls "$T/ds/vid_000011" | wc -l)
check "12 list lines, 9 frames per video (got $lines, $frames)" $([ "$lines" -eq 12 ] && [ "$frames" -eq 9 ]; echo $?)
run "$PSDATA" check --list "$T/ds/train.txt" --root "$T/ds"
check "check: all frames decode" $([ $rc -eq 0 ] && grep -q "videos=10 skipped=0 classes=4 frames=90 bad_frames=0" "$T/out"; echo $?)
run "$PSDATA" pack --list "$T/ds/train.txt" --root "$T/ds" --out "$T/pk" --shard-videos 4
check "pack: 3 shards" $([ $rc -eq 0 ] && [ -f "$T/pk/shard-00002.idx" ] && [ ! -f "$T/pk/shard-00003.idx" ]; echo $?)
run "$PSDATA" check --packed "$T/pk"
check "check --packed: same counts" $([ $rc -eq 0 ] && grep -q "videos=10 skipped=0 classes=4 frames=90 bad_frames=0" "$T/out"; echo $?)

# bad inputs: (list text, expected message fragment)
i=0
while IFS='|' read -r text want; do
    i=$((i + 1))
    printf "$text" > "$T/bad.txt"
    run "$PSDATA" check --list "$T/bad.txt" --root "$T/ds"
    check "bad list $i: exit 1 with: $want" $([ $rc -eq 1 ] && grep -qF "$want" "$T/err"; echo $?)
done <<'CASES'
vid_000000 9 0\nvid_000001 9\n|bad.txt:2: expected 'frame_dir num_frames label'
vid_000000 nine 0\n|bad.txt:1: num_frames 'nine'
vid_000000 9 0\nmissing_dir 9 1\n|bad.txt:2: frame directory
vid_000000 15 0\n|bad.txt:1: video 'vid_000000' has 15 frames in the list but
vid_000000 9 x\n|bad.txt:1: label 'x'
CASES
printf 'vid_000000 9 0\nmissing 9 1\nvid_000002 9 2\n' > "$T/skip.txt"
run "$PSDATA" check --list "$T/skip.txt" --root "$T/ds" --skip-bad
check "--skip-bad counts the skip" $([ $rc -eq 0 ] && grep -q "videos=2 skipped=1" "$T/out"; echo $?)
printf 'garbage' > "$T/ds/vid_000001/img_00005.jpg"
run "$PSDATA" check --list "$T/ds/train.txt" --root "$T/ds"
check "check: a bad JPEG is named with list line" $([ $rc -eq 1 ] && grep -q "train.txt:2: video 'vid_000001'.*img_00005.jpg" "$T/err"; echo $?)
run "$PSDATA" pack --list "$T/ds/train.txt" --root "$T/ds" --out "$T/pk2"
check "pack refuses a non-JPEG frame" $([ $rc -eq 1 ] && grep -q "img_00005\|frame 5 is not a JPEG" "$T/err"; echo $?)
run "$PSDATA" check --list /nonexistent.txt
check "missing list: exit 1 naming it" $([ $rc -eq 1 ] && grep -q "/nonexistent.txt" "$T/err"; echo $?)
run "$PSDATA" gen-video --out "$T/x" --size 3
check "bad option value: exit 2" $([ $rc -eq 2 ]; echo $?)
run "$PSDATA" gen-video --out "$T/x" --movers 0
check "--movers 0 refused: exit 2" $([ $rc -eq 2 ]; echo $?)
run "$PSDATA" frobnicate
check "unknown command: exit 2" $([ $rc -eq 2 ]; echo $?)
head -c 3000 /dev/urandom > "$T/rand.txt"
run "$PSDATA" check --list "$T/rand.txt" --root "$T/ds"
check "random bytes as a list: clean failure (rc $rc)" $([ $rc -eq 1 ]; echo $?)
run "$PSDATA" check --packed "$T/ds"
check "--packed on a non-pack directory fails cleanly" $([ $rc -eq 1 ] && grep -q "no pack index" "$T/err"; echo $?)
echo "1..$n"
[ $failed -eq 0 ]
