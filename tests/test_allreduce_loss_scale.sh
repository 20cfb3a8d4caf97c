#!/usr/bin/env bash
# Loss scaling in ring mode: an overflow on any worker skips
# that step on every worker.  The smoke model, dynamic loss scale with a
# growth window of 3 steps, rank 1 ALONE gets an Inf gradient at step 4
# (--debug-overflow-at 4), once through 1 psd + 3 workers (PS mode, whose
# verdict psd echoes) and once through a 3-rank ring (the flag travels as
# one extra fp32 element of the allreduce).  Checked:
#  - every ring rank skips step 4: rank 1 "on this worker", ranks 0 and 2
#    (rank 0 is not rank 1's ring neighbour downstream) "on another worker";
#  - every ring rank's scale sequence equals the policy's, computed here
#    independently (start 65536, x2 after 3 clean steps, /2 on overflow),
#    and equals the PS-mode run's;
#  - the ring's final weights equal PS mode's within 1e-5 relative (the
#    tolerance and rationale of tests/test_allreduce.sh: the two sum in
#    different orders), and the same check rejects a ring run whose step 4
#    is applied (no forced overflow) -- so it can fail;
#  - fp16 wire: the flag is still exact (an fp16-rounded sum would not be
#    needed for 0/1, but the flag goes in the fp32 tail anyway) and the
#    ranks end identical.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

NW=3
B=8
STEPS=12
K=4
WIN=3
INIT=65536
COMMON=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 2
        --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3 --batch $B
        --loss-scale dynamic --loss-scale-window "$WIN" --progress-every 0 --log-level info)

# run_all MODE OUT OVF_RANK [flags...]: NW workers, in PS mode (MODE=ps,
# $SERVERS) or ring mode (MODE=ring); rank OVF_RANK (-1: none) gets the fault.
run_all() {
    local mode=$1 out=$2 ovf=$3 r rc=0 peers=; shift 3
    local wp=() how=()
    mkdir -p "$out"
    if [ "$mode" = ring ]; then
        peers=$(peers_of $NW)
        how=(--mode allreduce --peers "$peers")
    else
        how=(--servers "$SERVERS")
    fi
    for ((r = 0; r < NW; r++)); do
        local extra=()
        [ "$r" -eq "$ovf" ] && extra=(--debug-overflow-at $K)
        timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" "${how[@]}" --rank $r --num-workers $NW \
            --out "$out" "${COMMON[@]}" "$@" "${extra[@]}" >"$out/w$r.out" 2>"$out/w$r.err" &
        wp+=($!)
        PIDS+=($!)
    done
    for ((r = 0; r < NW; r++)); do
        wait "${wp[$r]}" || { rc=1; echo "# $mode worker $r failed"; show_log "$out/w$r.err"; }
    done
    return $rc
}

expect=$(ls_policy "$STEPS" "$K" "$WIN" "$INIT")
diag "expected scale changes (step old new): $(echo "$expect" | tr '\n' ';')"

start_cluster 1 $NW --mode sync
ok $? "psd started ($SERVERS)"
run_all ps "$T/ps" 1 --dtype fp32
ok $? "PS mode: $NW workers, overflow at step $K on rank 1"
sp=$(ls_seq_of "$T/ps/w0.err")
[ -n "$expect" ] && [ "$sp" = "$expect" ]
ok $? "PS mode: rank 0's scale sequence is the policy's ($(echo "$sp" | tr '\n' ';'))"

run_all ring "$T/ring" 1 --dtype fp32
ok $? "ring mode: $NW ranks finished $STEPS steps with an overflow at step $K on rank 1"
for ((r = 0; r < NW; r++)); do
    sr=$(ls_seq_of "$T/ring/w$r.err")
    [ "$sr" = "$expect" ] && [ "$sr" = "$sp" ]
    ok $? "ring rank $r: scale sequence == the policy's == PS mode's ($(echo "$sr" | tr '\n' ';'))"
done
grep -q "loss scale: step $K skipped (overflow on this worker)" "$T/ring/w1.err" &&
    grep -q "loss scale: step $K skipped (overflow on another worker)" "$T/ring/w0.err" &&
    grep -q "loss scale: step $K skipped (overflow on another worker)" "$T/ring/w2.err"
ok $? "ring: rank 1 skipped for its own overflow, ranks 0 and 2 learnt it from the allreduce"
n=0
for ((r = 0; r < NW; r++)); do
    grep -q "1 of $STEPS steps skipped" "$T/ring/w$r.err" && n=$((n + 1))
    [ "$(grep -c 'skipped (overflow' "$T/ring/w$r.err")" -eq 1 ] || n=$((n - 10))
done
[ "$n" -eq $NW ]
ok $? "every ring rank skipped exactly 1 of $STEPS steps"
compare "$T/ring/model.safetensors" "$T/ps/model.safetensors" 1e-5
ok $? "ring weights == PS weights with the same forced overflow (max rel diff <= 1e-5)"
e0=$(final_value "$T/ring/w0.out" eval_loss); e2=$(final_value "$T/ring/w2.out" eval_loss)
[ -n "$e0" ] && [ "$e0" = "$e2" ]
ok $? "ring ranks 0 and 2 hold the same weights (eval loss $e0)"

# Without the fault the ring applies step K: the weight check must notice.
run_all ring "$T/noovf" -1 --dtype fp32
ok $? "ring mode without a forced overflow"
[ -z "$(ls_seq_of "$T/noovf/w0.err" | awk -v k=$K '$1 == k')" ]
ok $? "without the fault, step $K is clean on rank 0"
compare "$T/noovf/model.safetensors" "$T/ps/model.safetensors" 1e-5 >/dev/null
[ $? -eq 1 ]
ok $? "the same weight check rejects the ring run that applied step $K"

# fp16 wire: same verdict everywhere, same scale sequence, identical ranks.
run_all ring "$T/r16" 2 --dtype fp16
ok $? "ring mode, fp16 wire, overflow at step $K on rank 2"
good=1
for ((r = 0; r < NW; r++)); do [ "$(ls_seq_of "$T/r16/w$r.err")" = "$expect" ] || good=0; done
[ $good -eq 1 ]
ok $? "fp16 wire: every rank's scale sequence is the policy's"
a=$(final_value "$T/r16/w0.out" eval_loss); b=$(final_value "$T/r16/w1.out" eval_loss)
[ -n "$a" ] && [ "$a" = "$b" ]
ok $? "fp16 wire: ranks identical after the skip (eval loss $a)"
tap_done
