#!/usr/bin/env bash
# A run's plots: 1 psd + 2 psworker train a narrow TSM for a few steps with
# validation; rank 0 draws DIR/plots/*.png at the end.  Every PNG is a PNG
# of the expected size, and the data extent gnuplot reports for each plot
# (its GPVAL_DATA_* after drawing, printed by `psctl plot`) equals what awk
# computes from the CSV files: loss and lr ranges, validation top-1/top-5,
# the sum over the ranks of clips/s per step.  Then what must fail does,
# clearly: a missing run directory, malformed or missing CSV files (named
# with their line, previous plots left as they were), no gnuplot (a run
# still succeeds and says how to get the plots later).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
PSCTL=$top_builddir/psctl
for b in "$PSDATA" "$PSCTL"; do [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }; done
command -v gnuplot >/dev/null || { echo "1..0 # SKIP gnuplot not installed (apt-get install gnuplot-nox)"; exit 77; }

"$PSDATA" gen-video --out "$T/ds" --videos 24 --frames 8 --size 32 --seed 3 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 24-video dataset"
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --lr 0.02 --schedule cosine --warmup-steps 3 --seed 5
       --train-list "$T/ds/train.txt" --val-list "$T/ds/val.txt" --root "$T/ds")
start_cluster 1 2 --mode sync
ok $? "psd started ($SERVERS)"
run_workers 2 "$T/run" "${MODEL[@]}" --batch 2 --steps 12 --val-every 4 --partition-bytes 65536 \
    --log-level info
ok $? "2 workers trained 12 steps, validating every 4"
PNGS="loss lr val throughput step_split"
for p in $PNGS; do
    f=$T/run/plots/$p.png
    [ "$(head -c 8 "$f" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
        [ "$(od -An -tu1 -j16 -N8 "$f" | awk '{ print $3*256+$4 "x" $7*256+$8 }')" = 1100x540 ] &&
        [ "$(stat -c %s "$f")" -gt 10000 ]
    ok $? "rank 0 drew $p.png: a 1100x540 PNG of $(stat -c %s "$f" 2>/dev/null) bytes"
done
grep -q "plots: $T/run/plots/loss.png" "$T/run/w0.err"
ok $? "rank 0's log gives the plots' paths" || show_log "$T/run/w0.err"
[ ! -e "$T/run/plots/plots.gp.tmp" ] && ! ls "$T/run/plots/"*.part >/dev/null 2>&1 &&
    grep -q '^\$val << EOD' "$T/run/plots/plots.gp"
ok $? "plots.gp kept (data inline), no temporary file left"

"$PSCTL" plot "$T/run" >"$T/plot.out" 2>"$T/plot.err"
ok $? "psctl plot RUN draws them again" || show_log "$T/plot.err"

# extent(PNG): "x0 x1 y0 y1" as psctl printed it
extent() { sed -n "s|^plot: $T/run/plots/$1.png steps=\([^.]*\)\.\.\([^ ]*\) y=\(.*\)\.\.\(.*\)$|\1 \2 \3 \4|p" "$T/plot.out"; }
# same A B: four numbers each, equal within 1e-6 relative
same() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != 4 || m != 4) exit 1
    for (i = 1; i <= 4; i++) { d = x[i] - y[i]; if (d < 0) d = -d; t = y[i] < 0 ? -y[i] : y[i]
        if (d > 1e-6 * t + 1e-12) exit 1 } }'; }
R0=$T/run/metrics-rank0.csv R1=$T/run/metrics-rank1.csv V=$T/run/val.csv
# loss: both ranks' losses and the validation loss
want=$(awk -F, 'FNR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { x = $c["iteration"]; v = $c["loss"]; if (!n++) { x0 = x1 = x; y0 = y1 = v }
      if (x < x0) x0 = x; if (x > x1) x1 = x; if (v < y0) y0 = v; if (v > y1) y1 = v }
    END { printf "%.17g %.17g %.17g %.17g", x0, x1, y0, y1 }' "$R0" "$R1" "$V")
got=$(extent loss)
same "$got" "$want"
ok $? "loss.png: steps and loss $got = the CSVs' ($want)"
want=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { x = $c["iteration"]; v = $c["lr"]; if (NR == 2) { x0 = x1 = x; y0 = y1 = v }
      if (x < x0) x0 = x; if (x > x1) x1 = x; if (v < y0) y0 = v; if (v > y1) y1 = v }
    END { printf "%.17g %.17g %.17g %.17g", x0, x1, y0, y1 }' "$R0")
got=$(extent lr)
same "$got" "$want"
ok $? "lr.png: steps and lr $got = rank 0's CSV ($want)"
[ "$(csv_rows "$V")" -eq 3 ]
ok $? "val.csv: validations at steps 4 and 8 and the final one"
want=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { x = $c["iteration"]; if (NR == 2) { x0 = x1 = x; y0 = y1 = $c["top1"] }
      if (x < x0) x0 = x; if (x > x1) x1 = x
      for (k = 0; k < 2; k++) { v = k ? $c["top5"] : $c["top1"]; if (v < y0) y0 = v; if (v > y1) y1 = v } }
    END { printf "%.17g %.17g %.17g %.17g", x0, x1, y0, y1 }' "$V")
got=$(extent val)
same "$got" "$want"
ok $? "val.png: steps and top-1/top-5 $got = val.csv's ($want)"
# clips/s of all workers per step: sum over the ranks of clips * 1000 / step_ms
want=$(awk -F, 'FNR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { it = $c["iteration"]; r[it] += $c["clips"] * 1000 / $c["step_ms"]; k[it]++ }
    END { for (it in r) if (k[it] == 2) { if (!n++) { x0 = x1 = it + 0; y0 = y1 = r[it] }
            if (it + 0 < x0) x0 = it + 0; if (it + 0 > x1) x1 = it + 0
            if (r[it] < y0) y0 = r[it]; if (r[it] > y1) y1 = r[it] }
          printf "%.17g %.17g %.17g %.17g", x0, x1, y0, y1 }' "$R0" "$R1")
got=$(extent throughput)
same "$got" "$want"
ok $? "throughput.png: steps and clips/s of both workers $got = the CSVs' ($want)"
# the split: rank 0's steps 1.. (step 0 left out), stacked averages within [0, max step_ms]
got=$(extent step_split)
awk -F, -v g="$got" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    NR > 2 { if ($c["step_ms"] > m) m = $c["step_ms"]; last = $c["iteration"] }
    END { split(g, e, " "); exit !(e[1] == 1 && e[2] == last && e[3] >= 0 && e[4] > 0 && e[4] <= m + 0.01) }' "$R0"
ok $? "step_split.png: steps 1..11, ms per step within rank 0's step times ($got; the parts are rounded to 1 us each)"

# ---- a detector-like run made by hand: images, mAP, a NaN loss ----
D=$T/det
mkdir -p "$D"
{ echo "iteration,loss,lr,step_ms,compute_ms,comm_wait_ms,data_wait_ms,images"
  for i in $(seq 0 29); do
      echo "$i,$(awk -v i="$i" 'BEGIN { printf "%.6f", 3 / (1 + i) }'),0.04,50.000,40.000,5.000,2.000,8"
  done; } >"$D/metrics-standalone.csv"
printf 'iteration,epoch,map,ap50,ap75,images\n10,1.0,0.1000,0.3000,0.0500,20\n20,2.0,0.2500,0.6000,nan,20\n30,3.0,0.4000,0.8000,0.3500,20\n' \
    >"$D/val-standalone.csv"
"$PSCTL" plot "$D" >"$T/det.out" 2>"$T/det.err"
ok $? "psctl plot on a detector's CSVs (images, mAP / AP50 / AP75, a NaN)" || show_log "$T/det.err"
grep -q "^plot: $D/plots/val.png steps=10..30 y=0.05..0.8$" "$T/det.out" &&
    grep -q "^plot: $D/plots/throughput.png steps=0..29 y=160..160$" "$T/det.out" &&
    grep -q 'set ylabel "images/s"' "$D/plots/plots.gp" && grep -q 'title "mAP"' "$D/plots/plots.gp"
ok $? "... mAP 0.05..0.8 (the NaN left out), 160 images/s, axes named so" || show "$T/det.out"

# ---- what must fail, clearly ----
"$PSCTL" plot "$T/nothing-here" >"$T/e1.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "$T/nothing-here: No such file or directory" "$T/e1.out"
ok $? "a missing run directory: exit $rc naming it" || show "$T/e1.out"
mkdir -p "$T/empty"
"$PSCTL" plot "$T/empty" >"$T/e2.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "not a psworker run directory" "$T/e2.out"
ok $? "a directory without metrics CSV: exit $rc, 'not a psworker run directory'" || show "$T/e2.out"

sums() { md5sum "$1/plots/"*.png "$1/plots/plots.gp" | awk '{ print $1 }'; }
before=$(sums "$T/run")
bad() { # NAME FILE SED-EXPR MESSAGE: corrupt a copy of the run, psctl plot must name FILE:LINE
    local b=$T/bad-$1
    rm -rf "$b" && cp -r "$T/run" "$b" && sed -i "$3" "$b/$2"
    "$PSCTL" plot "$b" >"$T/$1.out" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -qF -- "$b/$4" "$T/$1.out" && ! ls "$b/plots/"*.part >/dev/null 2>&1 &&
        [ ! -e "$b/plots/plots.gp.tmp" ] &&
        [ "$(sums "$b")" = "$before" ]
    ok $? "$1: exit $rc, '$4', the previous plots untouched" || show "$T/$1.out"
}
bad not-a-number metrics-rank1.csv '5s/^\([0-9]*\),[^,]*,/\1,abc,/' "metrics-rank1.csv:5: loss 'abc' is not a number"
nf=$(head -n 1 "$T/run/metrics-rank0.csv" | awk -F, '{ print NF }')
bad short-row metrics-rank0.csv '3s/,[^,]*$//' "metrics-rank0.csv:3: $((nf - 1)) fields, the header has $nf"
bad no-lr-column metrics-rank0.csv '1s/,lr,/,rate,/' "metrics-rank0.csv:1: no column 'lr' in the header"
bad no-samples metrics-rank1.csv '1s/,clips$/,frames/' "metrics-rank1.csv:1: no samples column"
bad bad-val val.csv '3s/^[0-9]*,/x,/' "val.csv:3: iteration 'x' is not a number"
bad empty-csv metrics-rank0.csv '1,$d' "metrics-rank0.csv: empty (no header line)"
# a last line still being written (no newline yet) is left out, not an error
cp -r "$T/run" "$T/torn" && printf '12,0.5' >>"$T/torn/metrics-rank1.csv"
"$PSCTL" plot "$T/torn" >"$T/torn.out" 2>&1
ok $? "a last line without its newline (a run still writing): plotted without it" || show "$T/torn.out"
grep -q "metrics-rank1.csv: its last line is still being written" "$T/torn.out"
ok $? "... and said so"
# a rank that failed before its first step, validation not reached yet: plotted without them
cp -r "$T/run" "$T/early" && head -n 1 "$T/run/metrics-rank1.csv" >"$T/early/metrics-rank1.csv" &&
    head -n 1 "$T/run/val.csv" >"$T/early/val.csv"
"$PSCTL" plot "$T/early" >"$T/early.out" 2>&1 && grep -q "metrics-rank1.csv: no step recorded (left out)" "$T/early.out" &&
    grep -q "val.csv has no finite top1/top5 or map/ap50/ap75 yet: no validation plot" "$T/early.out" &&
    grep -q "^plot: $T/early/plots/throughput.png steps=0..11 " "$T/early.out" &&
    [ ! -e "$T/early/plots/val.png" ]
ok $? "a rank without steps and a val.csv without rows: left out, said, the rest plotted (the old val.png removed)" ||
    show "$T/early.out"
"$PSCTL" plot >"$T/usage.out" 2>&1
[ $? = 2 ] && grep -q "plot takes one argument" "$T/usage.out"
ok $? "psctl plot without a directory: usage error, exit 2"

# ---- no gnuplot: training still succeeds and says how to get the plots ----
TIMEOUT=$(command -v timeout)
PATH=/nonexistent "$TIMEOUT" 60 "$PSW" --standalone --steps 20 --out "$T/nognu" >"$T/nognu.out" 2>"$T/nognu.err"
rc=$?
[ $rc = 0 ] && grep -q "gnuplot not found: no plots drawn in $T/nognu/plots" "$T/nognu.err" &&
    grep -q "apt-get install gnuplot-nox) and run: psctl plot $T/nognu" "$T/nognu.err" &&
    grep -q '^final:' "$T/nognu.out" && [ ! -e "$T/nognu/plots/plots.gp.tmp" ]
ok $? "without gnuplot a run exits $rc, saying how to install it and run psctl plot later" || show "$T/nognu.err"
PATH=/nonexistent "$PSCTL" plot "$T/nognu" >"$T/nognu2.out" 2>&1
[ $? = 1 ] && grep -q "gnuplot not found" "$T/nognu2.out"
ok $? "psctl plot without gnuplot: exit 1, saying so"
"$PSCTL" plot "$T/nognu" >"$T/nognu3.out" 2>&1 && [ -s "$T/nognu/plots/loss.png" ] &&
    grep -q "note: no val-standalone.csv: no validation plot" "$T/nognu3.out"
ok $? "with gnuplot back, psctl plot draws that run (no validation CSV: said)" || show "$T/nognu3.out"
tap_done
