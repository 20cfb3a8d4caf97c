#!/usr/bin/env bash
# BN running statistics averaged through the servers (--bn-sync):
# 2 workers reading different data end with the same running statistics,
# equal to the mean of what each computes on its own, and the exported file
# holds them.
#
# Closed form: with lr 0 the weights never move, so each worker's batch
# statistics at step k are fixed numbers b_r(k), and a BN's update
# s <- (1-m) s + m b is linear.  Synchronised, s_K = (1-m) s_{K-1} + m mean_r b_r(K)
# = mean_r of the unsynchronised s_r,K (same start).  So K steps with
# --bn-sync 1 must equal the element-wise mean of the two ranks' files of the
# same run with --bn-sync 0 (tests/tools/bn_sync_mean), within 1e-5 (norm_rel,
# tests/tools/st_compare; one rounding of w - (w - local) per step), with fp16 on
# the wire too (the statistics always travel raw fp32; both runs use the
# same fp16-rounded weights).  With lr > 0 the two ranks' files must be
# bit-identical (everything, statistics included).
# Controls: without sync the ranks' statistics differ, and the sync result
# differs from rank 0's own.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
MEAN=$top_builddir/tests/tools/bn_sync_mean
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
[ -x "$MEAN" ] || { echo "1..0 # SKIP tests/tools/bn_sync_mean not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q -- '--bn-sync' || { echo "1..0 # SKIP psworker without --bn-sync"; exit 77; }

K=3
"$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 32 --seed 3 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 16-video dataset"
DATA=(--train-list "$T/ds/train.txt" --root "$T/ds")
# narrow TSM-R18 at 32x32, 4 frames: milliseconds per step; BN in training
# mode so every BN's statistics move
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --momentum 0.9 --seed 5 --data-seed 9 --steps $K --batch 2
       --partition-bytes 65536 --bn train --save-all-ranks)

stop_cluster() {
    local p
    stop_pids
    PIDS=()
}

# run NAME [psworker flags]: 1 psd + 2 workers, files in $T/NAME
run() {
    local name=$1; shift
    start_cluster 1 2 --mode sync || return 1
    run_workers 2 "$T/$name" "${MODEL[@]}" "${DATA[@]}" "$@"
    local rc=$?
    stop_cluster
    return $rc
}

run s0 --lr 0 --bn-sync 1
ok $? "2 workers, lr 0, --bn-sync 1: $K steps"
run n0 --lr 0 --bn-sync 0
ok $? "2 workers, lr 0, --bn-sync 0: $K steps"
"$MEAN" "$T/mean0.safetensors" "$T/n0/model.safetensors" "$T/n0/model-rank1.safetensors"
ok $? "mean of the two ranks' unsynchronised files"

"$STC" "$T/n0/model-rank1.safetensors" "$T/n0/model.safetensors" --tol 1e-3 >"$T/c1" 2>&1
[ $? -eq 1 ]
ok $? "control: unsynchronised, the ranks' statistics differ (different data): $(cat "$T/c1")"
"$STC" "$T/s0/model.safetensors" "$T/mean0.safetensors" --tol 1e-5 >"$T/c2" 2>&1
ok $? "synchronised rank 0 export == mean of the unsynchronised ranks within 1e-5: $(cat "$T/c2")"
"$STC" "$T/s0/model-rank1.safetensors" "$T/s0/model.safetensors" --tol 0 >"$T/c3" 2>&1
ok $? "synchronised: rank 1's model and statistics == rank 0's, bit for bit"
"$STC" "$T/s0/model.safetensors" "$T/n0/model.safetensors" --tol 1e-3 >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "control: the synchronised statistics are not rank 0's own"

n0=$(final_value "$T/s0/w0.out" bn_stats)
c0=$(final_value "$T/s0/w0.out" bn_crc)
c1=$(final_value "$T/s0/w1.out" bn_crc)
[ -n "$n0" ] && [ "$n0" -gt 0 ] && [ -n "$c0" ] && [ "$c0" = "$c1" ]
ok $? "final lines: $n0 BN statistics tensors, bn_crc equal on both ranks ($c0 $c1)"
[ "$(final_value "$T/n0/w0.out" bn_stats)" = 0 ]
ok $? "final line of a --bn-sync 0 run: bn_stats=0"

run s1 --lr 0.05 --bn-sync 1
ok $? "2 workers, lr 0.05, --bn-sync 1"
"$STC" "$T/s1/model-rank1.safetensors" "$T/s1/model.safetensors" --tol 0 >"$T/c4" 2>&1
ok $? "lr 0.05: both ranks hold identical weights and statistics after $K steps"
run n1 --lr 0.05 --bn-sync 0
ok $? "2 workers, lr 0.05, --bn-sync 0"
"$STC" "$T/n1/model-rank1.safetensors" "$T/n1/model.safetensors" --tol 1e-3 >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "control: lr 0.05 without sync, the ranks' statistics differ"

run h0 --lr 0 --bn-sync 1 --dtype fp16
ok $? "2 workers, lr 0, --bn-sync 1, fp16 wire"
run hn --lr 0 --bn-sync 0 --dtype fp16
ok $? "2 workers, lr 0, --bn-sync 0, fp16 wire"
"$MEAN" "$T/meanh.safetensors" "$T/hn/model.safetensors" "$T/hn/model-rank1.safetensors" &&
"$STC" "$T/h0/model.safetensors" "$T/meanh.safetensors" --tol 1e-5 >"$T/c5" 2>&1
ok $? "fp16 wire: synchronised == mean of the unsynchronised ranks within 1e-5: $(cat "$T/c5")"
"$STC" "$T/h0/model-rank1.safetensors" "$T/h0/model.safetensors" --tol 0 >/dev/null 2>&1
ok $? "fp16 wire: both ranks identical"

# The statistics travel exactly: raw fp32 in partitions of their own
# (PS_PART_EXACT), whatever --codec / --dtype.  At lr 0 a sign-codec run
# changes nothing but the gradients' wire, so its files (statistics
# included) must equal the fp32-wire run s0 bit for bit -- before, the
# statistics' differences went out as 1-bit signs.  An fp16 wire also
# rounds the pulled weights, so that pair starts from a file whose weights
# are fp16 values (h0's export): then fp16 and fp32 wire runs must agree
# bit for bit too -- before, the pulled statistics were rounded to fp16.
run sg --lr 0 --bn-sync 1 --codec sign
ok $? "2 workers, lr 0, --bn-sync 1, --codec sign"
for r in 0 1; do
    f=model.safetensors && [ $r = 1 ] && f=model-rank1.safetensors
    "$STC" "$T/sg/$f" "$T/s0/model.safetensors" --tol 0 >"$T/c6$r" 2>&1
    ok $? "sign codec: rank $r's weights and statistics == the fp32-wire sync run's, bit for bit: $(cat "$T/c6$r")"
done
"$STC" "$T/sg/model.safetensors" "$T/mean0.safetensors" --tol 1e-5 >"$T/c7" 2>&1
ok $? "sign codec: == mean of the unsynchronised ranks within 1e-5: $(cat "$T/c7")"
W16=(--weights "$T/h0/model.safetensors")
run w32 --lr 0 --bn-sync 1 "${W16[@]}"
ok $? "2 workers, lr 0, fp32 wire, from fp16-valued weights"
run w16 --lr 0 --bn-sync 1 --dtype fp16 "${W16[@]}"
ok $? "2 workers, lr 0, fp16 wire, from the same weights"
for r in 0 1; do
    f=model.safetensors && [ $r = 1 ] && f=model-rank1.safetensors
    "$STC" "$T/w16/$f" "$T/w32/model.safetensors" --tol 0 >"$T/c8$r" 2>&1
    ok $? "fp16 wire: rank $r's weights and statistics == the fp32-wire run's, bit for bit: $(cat "$T/c8$r")"
done
"$STC" "$T/w16/model.safetensors" "$T/h0/model.safetensors" --tol 1e-3 >/dev/null 2>&1
[ $? -eq 1 ]
ok $? "control: the statistics moved from the starting file's"

# Training with the sign codec: the statistics stay usable (before, the
# 1-bit differences wrecked them: this run ended with val_loss=nan, and
# top1=1 from the NaN logits; fp32 wire: val_loss 16.9, sign now 10.0).
run sv --lr 0.02 --steps 20 --bn-sync 1 --codec sign --val-list "$T/ds/train.txt"
ok $? "2 workers, lr 0.02, 20 steps, --codec sign, validation at the end"
vl=$(final_value "$T/sv/w0.out" val_loss)
[[ $vl =~ ^[0-9]+\.[0-9]+$ ]] && [ -z "$(final_value "$T/sv/w0.out" nonfinite)" ]
ok $? "sign codec: finite validation loss ($vl), no video with non-finite logits"
[ "$(final_value "$T/sv/w0.out" bn_crc)" = "$(final_value "$T/sv/w1.out" bn_crc)" ]
ok $? "sign codec: both ranks hold the same statistics"

# which statistics travel: those a training forward updates (ResNet-18:
# 20 BNs -> 40 tensors with --bn train, bn1's 2 with partial, none frozen)
for mode in partial:2 frozen:0; do
    standalone "$T/m-${mode%%:*}" "${MODEL[@]}" "${DATA[@]}" --lr 0 --steps 1 --bn "${mode%%:*}"
    got=$(final_value "$T/m-${mode%%:*}/w0.out" bn_stats)
    [ "$got" = "${mode##*:}" ]
    ok $? "--bn ${mode%%:*}: $got BN statistics tensors averaged (want ${mode##*:})"
done
tap_done
