#!/usr/bin/env bash
# Data-parallel reproducibility of the video model: with every BN
# frozen (--bn frozen: running statistics in training, fixed affine) and
# dropout 0, each clip's loss depends on that clip alone, so the mean
# gradient over W*B clips equals the mean of W per-worker means over B clips.
# Then K sync steps of W=2 workers x batch B through psd (fp32 wire), one
# --standalone process with batch 2B, and one worker with batch 2B through
# psd reach the same weights within 1e-5 relative (st_compare: per tensor
# max|a-b| / max|b|, worst tensor).  The data side (rank r's B samples of a
# step are positions r*B.. of the 2B the single process reads, same
# augmentation) is tests/test_video_data.c's; what differs here is only the
# summation order of the gradient (two fp32 means summed and halved on the
# server vs one mean), ~1e-7 relative per step.
# Control: the same comparison with --bn train (per-worker batch statistics)
# must fail, so the check can tell the two apart.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q -- '--bn ' || { echo "1..0 # SKIP psworker without --bn"; exit 77; }

B=2
K=4
"$PSDATA" gen-video --out "$T/ds" --videos 24 --frames 8 --size 32 --seed 2 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 24-video dataset"
DATA=(--train-list "$T/ds/train.txt" --root "$T/ds")
# a narrow TSM-R18 at 32x32, 4 frames: a step takes milliseconds; lr high
# enough that K steps move the weights well beyond the tolerance
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 1 --dropout 0 --threads 1
       --loader-threads 1 --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --seed 5 --data-seed 9
       --steps $K --partition-bytes 65536)

start_cluster 2 2 --mode sync
ok $? "2 psd started ($SERVERS)"
run_workers 2 "$T/w2" "${MODEL[@]}" "${DATA[@]}" --bn frozen --batch $B
ok $? "W=2 workers x batch $B, BN frozen: $K sync steps"
stop_pids
PIDS=()

standalone "$T/ref" "${MODEL[@]}" "${DATA[@]}" --bn frozen --batch $((2 * B))
ok $? "standalone, batch $((2 * B)), BN frozen"
compare "$T/w2/model.safetensors" "$T/ref/model.safetensors" 1e-5
ok $? "W=2 x B == standalone 2B within 1e-5 (BN frozen, dropout 0, fp32 wire)"

start_cluster 2 1 --mode sync
ok $? "2 psd for one worker"
run_workers 1 "$T/w1" "${MODEL[@]}" "${DATA[@]}" --bn frozen --batch $((2 * B))
ok $? "1 worker x batch $((2 * B)) through psd, BN frozen"
compare "$T/w1/model.safetensors" "$T/ref/model.safetensors" 1e-5
ok $? "1 worker x 2B through psd == standalone 2B within 1e-5"
compare "$T/w2/model.safetensors" "$T/w1/model.safetensors" 1e-5
ok $? "W=2 x B == 1 worker x 2B (both through psd) within 1e-5"
stop_pids
PIDS=()

# the weights moved: the check is not comparing two copies of the init
standalone "$T/init" "${MODEL[@]}" "${DATA[@]}" --bn frozen --batch $((2 * B)) --lr 0 --momentum 0
compare "$T/ref/model.safetensors" "$T/init/model.safetensors" 1e-5 >/dev/null
[ $? -eq 1 ]
ok $? "the trained weights differ from the initial ones beyond the tolerance"

# control: BN in training mode uses each worker's batch statistics, so the
# same comparison must fail
start_cluster 2 2 --mode sync
ok $? "2 psd for the BN-train control"
run_workers 2 "$T/w2t" "${MODEL[@]}" "${DATA[@]}" --bn train --batch $B
ok $? "W=2 workers x batch $B, BN train"
standalone "$T/reft" "${MODEL[@]}" "${DATA[@]}" --bn train --batch $((2 * B))
ok $? "standalone 2B, BN train"
compare "$T/w2t/model.safetensors" "$T/reft/model.safetensors" 1e-5 >/dev/null
[ $? -eq 1 ]
ok $? "control: with BN train the same comparison fails (batch statistics differ)"

# --zero-init-residual needs trainable BN: with frozen or partial BN the
# zeroed weights could never move, so the pair is a usage error naming the
# flag; with BN train it trains
for bn in "--bn frozen" "--bn partial" "--partial-bn"; do
    # shellcheck disable=SC2086 # bn: one flag and its value
    timeout 30 "$PSW" --standalone "${MODEL[@]}" "${DATA[@]}" $bn --zero-init-residual --batch $B \
        >"$T/zir.out" 2>"$T/zir.err"
    rc=$?
    [ $rc = 2 ] && grep -q -- "--zero-init-residual needs trainable BN" "$T/zir.err"
    ok $? "--zero-init-residual with $bn: exit 2, the message names the flag" || show_log "$T/zir.err"
done
standalone "$T/zir" "${MODEL[@]}" "${DATA[@]}" --bn train --zero-init-residual --batch $B --log-level info
ok $? "--zero-init-residual with --bn train trains"
grep -q "residual branches' last BN weights start at 0" "$T/zir/w0.err"
ok $? "its log says the residual branches' last BN weights start at 0"
tap_done
