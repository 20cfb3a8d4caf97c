#!/usr/bin/env bash
# 2 psd + 3 psworker, fp32 wire, sync mode, 50 steps: the final weights
# (rank 0's model.safetensors) must equal one process training on the
# concatenated batches (psworker --standalone --batch 3*B).
#
# "Max relative difference" here is, per tensor, max_i |a_i - b_i| divided
# by max_i |b_i| (the tensor's scale), worst tensor; it must be <= 1e-6.
# The two runs differ only in how the batch mean is formed (three fp32
# per-worker means summed on the server in rank order and divided by 3,
# versus one mean over 24 samples in double, rounded once): ~1 ulp of the
# gradient per step.  An emulation of both over 5 seeds gave 1.7e-7..4e-7
# after 50 and 120 steps; a lost or doubled update shows as ~1e-3.
# (A per-element |a-b|/|b| is no measure for weights that cross zero; the
# per-element figure with a floor is printed for information.)
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

B=8
STEPS=50
# 2,372 parameters (9,488 bytes) in partitions of <= 2,048 bytes: at least 5
# partitions, so both servers own several.
COMMON=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 5
        --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3)

start_cluster 2 3 --mode sync
ok $? "2 psd started on free ports ($SERVERS)"
run_workers 3 "$T/run" "${COMMON[@]}" --batch $B --dtype fp32
ok $? "3 workers finished $STEPS sync steps"
standalone "$T/ref" "${COMMON[@]}" --batch $((3 * B))
ok $? "standalone reference with batch $((3 * B))"

for r in 0 1 2; do
    n=$(csv_rows "$T/run/metrics-rank$r.csv")
    [ "$n" -eq $STEPS ]
    ok $? "rank $r CSV has $STEPS iterations (got $n)"
done
compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 1e-6
ok $? "fp32 wire: cluster weights == standalone weights (max rel diff <= 1e-6)"

# The comparison can fail: a reference trained one step less (what a lost
# update amounts to) must be far outside the tolerance.
standalone "$T/ref49" "${COMMON[@]}" --batch $((3 * B)) --steps $((STEPS - 1))
compare "$T/run/model.safetensors" "$T/ref49/model.safetensors" 1e-6 >/dev/null
[ $? -eq 1 ]
ok $? "the same check rejects a reference that is one step short"

# Every rank ends with the same weights, so the same eval loss.
e0=$(final_value "$T/run/w0.out" eval_loss)
e1=$(final_value "$T/run/w1.out" eval_loss)
e2=$(final_value "$T/run/w2.out" eval_loss)
er=$(final_value "$T/ref/w0.out" eval_loss)
i0=$(final_value "$T/run/w0.out" init_eval_loss)
diag "eval loss: ranks $e0 $e1 $e2, standalone $er (initial $i0)"
[ -n "$e0" ] && [ "$e0" = "$e1" ] && [ "$e1" = "$e2" ]
ok $? "all ranks report the same final eval loss"
[ -n "$e0" ] && [ -n "$i0" ] && fcmp "$e0 < $i0"
ok $? "eval loss fell ($i0 -> $e0)"
tap_done
