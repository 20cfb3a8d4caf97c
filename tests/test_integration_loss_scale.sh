#!/usr/bin/env bash
# Loss scaling end to end: 1 psd + 2 psworker, sync mode, smoke
# model, --loss-scale dynamic with a growth window of 3 steps; rank 1 alone
# gets an Inf gradient at step 4 (--debug-overflow-at 4).  Checked:
#  - psd skips exactly that update: one "update skipped" line per partition,
#    all for iteration 4 (the count equals the table's partitions);
#  - both workers log the same scale sequence, and it is the policy's
#    (computed here independently): x2 after steps 2, 7, 10, /2 at step 4;
#    rank 0 learns of the skip only from psd's WEIGHTS flag ("on another
#    worker");
#  - the final weights equal (max rel diff <= 1e-6, the tolerance and
#    rationale of test_integration_sync.sh) a standalone run over the
#    concatenated batch that applies no update at all at step 4 (weights
#    and momentum untouched, the LR schedule still counting the step), and
#    the same check rejects the standalone run that does apply step 4;
#  - without an overflow, dynamic scaling gives the weights of no scaling,
#    bit for bit (powers of two);
#  - bad --loss-scale / --precision values are refused with exit 2.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

B=8
STEPS=12
K=4
WIN=3
INIT=65536
BASE=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 2
      --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3)
COMMON=("${BASE[@]}" --loss-scale dynamic --loss-scale-window "$WIN")

# Bad options first (no servers needed: refused before connecting).
for bad in "--loss-scale static:3" "--loss-scale static:0" "--loss-scale sometimes" \
           "--precision fp8" "--loss-scale-window 0" "--debug-overflow-at 2"; do
    # shellcheck disable=SC2086
    "$PSW" --standalone --steps 1 $bad >"$T/bad.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "psworker: --" "$T/bad.out"
    ok $? "refused with exit 2 and a message naming the flag: $bad (rc $rc)" || show_log "$T/bad.out" 3
done

start_cluster 1 2 --mode sync
ok $? "psd started ($SERVERS)"

# Both ranks by hand: only rank 1 gets the fault.
mkdir -p "$T/run"
wp=()
for r in 0 1; do
    extra=()
    [ $r -eq 1 ] && extra=(--debug-overflow-at $K)
    timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 \
        --out "$T/run" --progress-every 0 --log-level info --batch $B --dtype fp32 \
        "${COMMON[@]}" "${extra[@]}" >"$T/run/w$r.out" 2>"$T/run/w$r.err" &
    wp+=($!)
    PIDS+=($!)
done
rc=0
for r in 0 1; do wait "${wp[$r]}" || { rc=1; show_log "$T/run/w$r.err"; }; done
ok $rc "2 workers finished $STEPS sync steps with an overflow at step $K on rank 1"

# psd: every partition's update of iteration K skipped, nothing else.
nskip=$(grep -c 'loss-scale overflow flagged, update skipped' "$T/psd0.log")
nskipk=$(grep -c "iteration $K: loss-scale overflow flagged, update skipped" "$T/psd0.log")
nparts=$(sed -n 's/.*tensors, \([0-9]*\) partitions,.*/\1/p' "$T/psd0.log" | head -n 1)
ndist=$(grep 'update skipped' "$T/psd0.log" | grep -o 'partition [0-9]*' | sort -u | wc -l)
diag "psd skipped $nskip partition updates ($nskipk at iteration $K, $ndist distinct; table has ${nparts:-?} partitions)"
[ "$nskip" -ge 1 ] && [ "$nskip" -eq "$nskipk" ] && [ "$nskip" -eq "${nparts:-0}" ] && [ "$ndist" -eq "$nskip" ]
ok $? "psd skipped the step-$K update of every partition and nothing else" || show_log "$T/psd0.log"

expect=$(ls_policy "$STEPS" "$K" "$WIN" "$INIT")
s0=$(ls_seq_of "$T/run/w0.err")
s1=$(ls_seq_of "$T/run/w1.err")
diag "expected scale changes (step old new): $(echo "$expect" | tr '\n' ';')"
diag "rank 0: $(echo "$s0" | tr '\n' ';')"
diag "rank 1: $(echo "$s1" | tr '\n' ';')"
[ -n "$expect" ] && [ "$s0" = "$expect" ]
ok $? "rank 0's scale sequence is the policy's (halved at step $K, doubled every $WIN clean steps)"
[ "$s1" = "$s0" ]
ok $? "rank 1's scale sequence is identical"
grep -q "loss scale: step $K skipped (overflow on another worker)" "$T/run/w0.err" &&
    grep -q "loss scale: step $K skipped (overflow on this worker)" "$T/run/w1.err"
ok $? "rank 0 learnt of rank 1's overflow from psd's reply; rank 1 saw its own"
grep -q "1 of $STEPS steps skipped" "$T/run/w0.err" && grep -q "1 of $STEPS steps skipped" "$T/run/w1.err"
ok $? "both ranks count 1 skipped step of $STEPS"

standalone "$T/ref" "${COMMON[@]}" --batch $((2 * B)) --debug-overflow-at $K
ok $? "standalone reference with batch $((2 * B)) skipping step $K"
compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 1e-6
ok $? "cluster weights == standalone that skips step $K (max rel diff <= 1e-6)"

standalone "$T/ref_all" "${COMMON[@]}" --batch $((2 * B))
compare "$T/run/model.safetensors" "$T/ref_all/model.safetensors" 1e-6 >/dev/null
[ $? -eq 1 ]
ok $? "the same check rejects the standalone run that applies step $K"

# Without overflows, scaling by a power of two and unscaling is exact: the
# same weights bit for bit as a run without loss scaling.
standalone "$T/ref_off" "${BASE[@]}" --batch $((2 * B)) --loss-scale off
compare "$T/ref_all/model.safetensors" "$T/ref_off/model.safetensors" 0
ok $? "no overflow: --loss-scale dynamic == --loss-scale off, bit for bit"
tap_done
