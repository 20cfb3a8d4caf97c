#!/usr/bin/env bash
# psworker --mode allreduce: the same smoke-model run through 1 psd
# and through a 3-worker ring, fp32 wire, must end with the same weights
# within 1e-5 relative (the two sum the three gradients in different orders:
# psd in rank order 0,1,2, the ring starting at each chunk's owner, so they
# agree to fp32 rounding, ~1e-7 per step).  A ring run one step short must be
# rejected by the same comparison.  Ring mode refuses top-k / sign with the
# reason; --compute synthetic:<model>:<ms> moves the real layout of a named
# model through the ring and through psd and reports its bytes per step.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }

# run_ring NWORKERS OUTDIR [psworker flags...]: all ranks of one ring, on
# fresh loopback ports (run_workers in ring mode).
run_ring() { RING_PEERS=$(peers_of "$1") run_workers "$@"; }

B=8
STEPS=30
COMMON=(--steps "$STEPS" --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --warmup-steps 5
        --schedule cosine --partition-bytes 2048 --seed 7 --data-seed 3 --batch $B --dtype fp32)

start_cluster 1 3 --mode sync
ok $? "psd started ($SERVERS)"
run_workers 3 "$T/ps" "${COMMON[@]}"
ok $? "PS mode: 3 workers finished $STEPS steps"
run_ring 3 "$T/ring" "${COMMON[@]}"
ok $? "ring mode: 3 workers finished $STEPS steps"
n=$(csv_rows "$T/ring/metrics-rank2.csv")
[ "$n" -eq "$STEPS" ]
ok $? "ring rank 2 CSV has $STEPS iterations (got $n)"
compare "$T/ring/model.safetensors" "$T/ps/model.safetensors" 1e-5
ok $? "fp32 wire: ring weights == PS weights (max rel diff <= 1e-5)"
run_ring 3 "$T/short" "${COMMON[@]}" --steps $((STEPS - 1)) >/dev/null
compare "$T/short/model.safetensors" "$T/ps/model.safetensors" 1e-5 >/dev/null
[ $? -eq 1 ]
ok $? "the same check rejects a ring run one step short"
e0=$(final_value "$T/ring/w0.out" eval_loss)
e1=$(final_value "$T/ring/w1.out" eval_loss)
e2=$(final_value "$T/ring/w2.out" eval_loss)
ep=$(final_value "$T/ps/w0.out" eval_loss)
i0=$(final_value "$T/ring/w0.out" init_eval_loss)
diag "eval loss: ring ranks $e0 $e1 $e2, PS $ep (initial $i0)"
[ -n "$e0" ] && [ "$e0" = "$e1" ] && [ "$e1" = "$e2" ]
ok $? "every ring rank holds the same weights (same final eval loss)"
[ -n "$e0" ] && [ -n "$i0" ] && fcmp "$e0 < $i0"
ok $? "eval loss fell ($i0 -> $e0)"
sent=$(grep '^wire:' "$T/ring/w0.out" | tr ' ' '\n' | sed -n 's/^sent_bytes=//p')
# 2,372 floats: a ring of 3 sends 2 * 2/3 of them per step, plus headers.
[ -n "$sent" ] && fcmp "$sent >= $STEPS * 2 * 2372 * 4 * 2 / 3 && $sent < $STEPS * 2 * 2372 * 4"
ok $? "ring bytes sent per rank ~ 2(W-1)/W of the gradient per step ($sent in $STEPS steps)"

# A video model (the same model glue as PS mode, worker/psworker/):
# TSM-ResNet-18 at width 8 on a generated dataset, 2 workers, 4 steps, both ways.
PSDATA=$top_builddir/psdata
if [ -x "$PSDATA" ] && "$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 32 --seed 2 \
        >/dev/null 2>"$T/gen.err"; then
    VID=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
         --loader-threads 1 --lr 0.01 --momentum 0.9 --seed 5 --data-seed 9 --batch 2 --steps 4
         --train-list "$T/ds/train.txt" --val-list "$T/ds/val.txt" --root "$T/ds"
         --partition-bytes 65536)
    start_psd 0 1 2 --mode sync && VSERVERS=tcp://127.0.0.1:$PORT_0
    SERVERS=$VSERVERS run_workers 2 "$T/vps" "${VID[@]}"
    ok $? "video PS mode: 2 workers, 4 steps"
    run_ring 2 "$T/vring" "${VID[@]}"
    ok $? "video ring mode: 2 workers, 4 steps"
    compare "$T/vring/model.safetensors" "$T/vps/model.safetensors" 1e-5
    ok $? "TSM-R18: ring weights (and averaged BN statistics) == PS weights within 1e-5"
else
    echo "ok $((tap_n += 1)) - # SKIP no psdata (video models not built)"
fi

# fp16 on the ring: quantised partial sums, still training and identical on all ranks.
run_ring 2 "$T/ring16" "${COMMON[@]}" --dtype fp16
ok $? "ring mode with fp16 wire"
a=$(final_value "$T/ring16/w0.out" eval_loss); b=$(final_value "$T/ring16/w1.out" eval_loss)
[ -n "$a" ] && [ "$a" = "$b" ]
ok $? "fp16 ring: both ranks identical (eval loss $a)"

# Compressors the ring cannot carry are refused, with the reason, before anything starts.
for c in topk sign lz4; do
    "$PSW" --mode allreduce --peers tcp://127.0.0.1:1,tcp://127.0.0.1:2 --rank 0 --codec $c \
        --steps 1 >"$T/refuse.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "codec $c is not supported in ring mode" "$T/refuse.out" &&
        grep -q "closed under" "$T/refuse.out"
    ok $? "--mode allreduce --codec $c: refused with exit 2 and the reason (rc $rc)"
done
"$PSW" --mode allreduce --peers tcp://127.0.0.1:1,tcp://127.0.0.1:2 --steps 1 >"$T/refuse.out" 2>&1
[ $? -eq 2 ] && grep -q "needs --rank" "$T/refuse.out"
ok $? "--mode allreduce without --rank: refused"
"$PSW" --mode allreduce --servers "$SERVERS" --peers tcp://127.0.0.1:1 --rank 0 --steps 1 >"$T/refuse.out" 2>&1
[ $? -eq 2 ] && grep -q "without servers" "$T/refuse.out"
ok $? "--mode allreduce with --servers: refused"
if ! grep -q '^#define PS_HAVE_NCCL 1' "$top_builddir/config.h" 2>/dev/null; then
    "$PSW" --mode allreduce --allreduce nccl --peers tcp://127.0.0.1:1 --rank 0 --steps 1 \
        >"$T/refuse.out" 2>&1
    [ $? -eq 2 ] && grep -q "allreduce nccl" "$T/refuse.out"
    ok $? "--allreduce nccl in a build without NCCL: refused"
else
    echo "ok $((tap_n += 1)) - # SKIP --allreduce nccl is built in: its run needs GPUs (tests/test_nccl)"
fi

# Synthetic compute: the real TSM-ResNet-18 layout (11,381,912 floats, 400 classes) for 3 steps.
run_ring 2 "$T/syn" --compute synthetic:tsm-r18:20 --steps 3 --dtype fp16
ok $? "--compute synthetic:tsm-r18:20 in ring mode"
l=$(grep '^final:' "$T/syn/w0.out")
diag "$l"
s=$(final_value "$T/syn/w0.out" sent_bytes_per_step)
c=$(final_value "$T/syn/w0.out" compute_ms)
# fp16, W = 2: each rank sends half of 11,381,912 * 2 bytes per direction pass, twice.
[ -n "$s" ] && fcmp "$s > 11381912 * 2 * 0.99 && $s < 11381912 * 2 * 1.02" && fcmp "$c >= 19.5"
ok $? "synthetic ring: fp16 bytes per step ~ 2(W-1)/W * 2 B * 11.4 M ($s), compute >= 20 ms ($c)"
start_psd 0 1 2 --mode sync && SERVERS=tcp://127.0.0.1:$PORT_0
ok $? "a second psd for 2 workers ($SERVERS)"
run_workers 2 "$T/synps" --compute synthetic:tsm-r18:5 --steps 3 --partition-bytes 4194304
ok $? "--compute synthetic:tsm-r18:5 through psd (2 workers)"
s=$(final_value "$T/synps/w1.out" sent_bytes_per_step)
[ -n "$s" ] && fcmp "$s > 11381912 * 4 && $s < 11381912 * 4 * 1.02"
ok $? "synthetic PS: a worker pushes the fp32 gradient once per step ($s bytes)"
"$PSW" --mode allreduce --peers tcp://127.0.0.1:1 --rank 0 --compute synthetic:vgg:10 >"$T/refuse.out" 2>&1
[ $? -eq 2 ] && grep -q 'unknown model "vgg"' "$T/refuse.out"
ok $? "--compute with an unknown model: refused"
tap_done
