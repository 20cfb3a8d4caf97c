#!/bin/sh
# psbench --mode ring on loopback: 1..3 workers with a real model
# layout and emulated compute, overlap on and off; the bytes each rank sends
# per step are the ring's 2(W-1)/W of the gradient (+ the 32-byte headers),
# and parameter-server codecs are refused with the reason.  Small sizes:
# this checks the driver, it measures nothing.
b=${top_builddir:-.}
if [ ! -x "$b/psbench" ]; then
    echo "1..0 # SKIP psbench not built in $b"
    exit 77
fi
out=${TMPDIR:-/tmp}/test_psbench_ring.$$
trap 'rm -f "$out" "$out.2"' EXIT INT TERM
n=0
fail=0
t() { # t COND DESCRIPTION
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

"$b/psbench" --mode ring --workers 1,2,3 --bytes 2M --partition-bytes 256K --dtype fp32,fp16 \
    --iters 3 --warmup 1 --pump-seconds 0 --timeout-s 120 >"$out" 2>&1
t $? "psbench --mode ring exits 0"
lines=$(grep -c '^psbench mode=ring servers=0 ' "$out")
[ "$lines" -eq 6 ]
t $? "6 configuration lines (got $lines)"
for w in 2 3; do
    for dt in fp32 fp16; do
        l=$(grep "^psbench mode=ring servers=0 workers=$w bytes=2097152 dtype=$dt " "$out")
        wo=$(kv "$l" wire_out_per_iter)
        es=4; [ $dt = fp16 ] && es=2
        # 2(W-1)/W of 524,288 elements, plus at most one 32-byte header per 64 B of payload
        awk -v x="${wo:-0}" -v w=$w -v e=$es 'BEGIN { p = 2 * (w - 1) / w * 524288 * e; exit !(x >= p && x < p * 1.01) }'
        t $? "W=$w $dt: wire bytes per step $wo = 2(W-1)/W of the gradient"
    done
done
l=$(grep "^psbench mode=ring servers=0 workers=1 bytes=2097152 dtype=fp32 " "$out")
[ "$(kv "$l" wire_out_per_iter)" = 0 ]
t $? "W=1 sends nothing"

"$b/psbench" --mode ring --workers 3 --model tsm-r18 --compute-ms 30 --overlap on,off --dtype fp16 \
    --iters 2 --warmup 1 --pump-seconds 0 --timeout-s 120 >"$out.2" 2>&1
t $? "ring with the tsm-r18 layout, emulated compute, overlap on/off"
for o in on off; do
    l=$(grep "^psbench mode=ring .* overlap=$o " "$out.2")
    c=$(kv "$l" compute_s)
    awk -v c="${c:-0}" 'BEGIN { exit !(c >= 0.029) }'
    t $? "overlap=$o: compute_s $c >= the emulated 30 ms, split reported"
done

"$b/psbench" --mode ring --workers 2 --bytes 1M --codec topk >"$out" 2>&1
[ $? -eq 2 ] && grep -q "not closed under" "$out"
t $? "--mode ring --codec topk refused with the reason"
echo "1..$n"
exit $fail
