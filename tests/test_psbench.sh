#!/bin/sh
# psbench end to end against real psd processes on loopback: every wire
# dtype x codec, 1x1 and 2x2, with --check (each worker compares its final
# weights with the closed-form sync SGD result), plus the key=value summary
# format the performance notes are pasted from.  Small sizes: this checks
# that the client and psd agree, it measures nothing.
b=${top_builddir:-.}
if [ ! -x "$b/psbench" ] || [ ! -x "$b/psd" ]; then
    echo "1..0 # SKIP psbench or psd not built in $b"
    exit 77
fi
out=${TMPDIR:-/tmp}/test_psbench.$$
trap 'rm -f "$out" "$out.lossy" "$out.model" "$out.fwd"' EXIT INT TERM

"$b/psbench" --psd "$b/psd" --servers 1,2 --workers 1,2 --bytes 1M --partition-bytes 256K \
    --dtype fp32,fp16,bf16 --codec raw,lz4 --iters 3 --warmup 1 --pump-seconds 0.2 --check \
    --timeout-s 240 >"$out" 2>&1
rc=$?

n=0
fail=0
t() { # t COND DESCRIPTION
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}

t "$rc" "psbench exits 0"
grep -q '^psbench loopback_tcp_gbps=[0-9.]* ' "$out"
t $? "loopback ceiling line"
lines=$(grep -c '^psbench mode=ps ' "$out")
[ "$lines" -eq 12 ]
t $? "12 configuration lines (got $lines)"
for sw in "servers=1 workers=1" "servers=2 workers=2"; do
    for dt in fp32 fp16 bf16; do
        for c in raw lz4; do
            l=$(grep "^psbench mode=ps $sw bytes=1048576 dtype=$dt codec=$c " "$out")
            echo "$l" | grep -q ' check=ok ' && echo "$l" | grep -Eq ' gbps_per_worker=[0-9]+\.[0-9]+ ' \
                && echo "$l" | grep -Eq ' median_s=[0-9.]+ p10_s=[0-9.]+ p90_s=[0-9.]+ '
            t $? "$sw $dt/$c: weights match the closed form, summary complete"
        done
    done
done
# fp16 / bf16 halve the bytes on the wire; lz4 must not grow them much
w32=$(grep "servers=1 workers=1 bytes=1048576 dtype=fp32 codec=raw " "$out" | sed 's/.*wire_out_per_iter=\([0-9]*\).*/\1/')
w16=$(grep "servers=1 workers=1 bytes=1048576 dtype=bf16 codec=raw " "$out" | sed 's/.*wire_out_per_iter=\([0-9]*\).*/\1/')
[ -n "$w32" ] && [ -n "$w16" ] && [ $((w16 * 2)) -le $((w32 + 4096)) ] && [ "$w32" -ge 1048576 ]
t $? "bf16 sends half the bytes of fp32 ($w16 vs $w32)"

# lossy pushes with error feedback: one worker checks exactly (its residual
# accounts for what was not sent), two cannot (check=skipped)
"$b/psbench" --psd "$b/psd" --servers 1,2 --workers 1,2 --bytes 1M --partition-bytes 256K \
    --dtype fp32,bf16 --codec topk,sign --topk-ratio 0.05 --iters 3 --warmup 1 --pump-seconds 0 \
    --check --timeout-s 240 --log-level error >"$out.lossy" 2>&1
t $? "psbench --codec topk,sign exits 0"
cat "$out.lossy" >>"$out"
for dt in fp32 bf16; do
    l=$(grep "^psbench mode=ps servers=1 workers=1 bytes=1048576 dtype=$dt codec=topk topk_ratio=0.05 " "$out.lossy")
    echo "$l" | grep -q ' check=ok '
    t $? "1x1 $dt/topk: weights == closed form with the residual"
    l=$(grep "^psbench mode=ps servers=1 workers=1 bytes=1048576 dtype=$dt codec=sign " "$out.lossy")
    echo "$l" | grep -q ' check=ok '
    t $? "1x1 $dt/sign: weights == closed form with the residual"
    n2=$(grep "^psbench mode=ps servers=2 workers=2 bytes=1048576 dtype=$dt codec=" "$out.lossy" | grep -c ' check=skipped')
    [ "$n2" -eq 2 ]
    t $? "2x2 $dt/topk,sign: ran, check skipped ($n2 lines)"
done
wk=$(grep "servers=1 workers=1 bytes=1048576 dtype=fp32 codec=topk " "$out.lossy" | sed 's/.*wire_out_per_iter=\([0-9]*\).*/\1/')
ws=$(grep "servers=1 workers=1 bytes=1048576 dtype=fp32 codec=sign " "$out.lossy" | sed 's/.*wire_out_per_iter=\([0-9]*\).*/\1/')
[ -n "$wk" ] && [ -n "$ws" ] && [ "$wk" -lt $((w32 / 5)) ] && [ "$ws" -lt $((w32 / 20)) ]
t $? "topk 5% and sign push a fraction of fp32's bytes ($wk, $ws vs $w32)"
rm -f "$out.lossy"

# --model with overlap: pushes submitted one by one during the emulated
# backward, 2 x 2, partitions small enough that each server owns more than
# the default window of 8.  Ran into a deadlock (the two workers' windows
# holding different partitions) before psbench let every partition in flight.
"$b/psbench" --psd "$b/psd" --model retinanet-r50 --servers 2 --workers 2 --partition-bytes 2M \
    --compute-ms 20 --overlap on,off --iters 2 --warmup 1 --pump-seconds 0 --check \
    --timeout-s 240 >"$out.model" 2>&1
t $? "psbench --model retinanet-r50 --overlap on,off 2x2 exits 0"
for ov in on off; do
    l=$(grep "^psbench mode=ps servers=2 workers=2 bytes=136059996 dtype=fp32 .* overlap=$ov " "$out.model")
    c=$(echo "$l" | sed -n 's/.* compute_s=\([0-9.]*\) .*/\1/p')
    echo "$l" | grep -q ' check=ok ' && echo "$l" | grep -q ' model=retinanet-r50 compute_ms=20 ' &&
        echo "$l" | grep -Eq ' comm_wait_s=[0-9.]+ ' &&
        awk -v c="${c:-0}" 'BEGIN { exit !(c >= 0.019 && c < 2) }'
    t $? "retinanet-r50 layout (34.0M floats) overlap=$ov: weights == closed form, compute ${c:-?} s"
done
cat "$out.model" >>"$out"
rm -f "$out.model"
# forward overlap (the next forward waits per partition for its weights)
# and the pull-credit scheduler (PUSH + PULL, front partitions first): the
# weights still equal the closed form, every push and pull is counted once
"$b/psbench" --psd "$b/psd" --model tsm-r18 --servers 2 --workers 2 --partition-bytes 1M \
    --compute-ms 30 --overlap fwd --iters 3 --warmup 1 --pump-seconds 0 --check \
    --timeout-s 240 >"$out.fwd" 2>&1
rc1=$?
"$b/psbench" --psd "$b/psd" --model tsm-r18 --servers 2 --workers 2 --partition-bytes 1M \
    --compute-ms 30 --overlap on,fwd --pull-credit 2 --iters 3 --warmup 1 --pump-seconds 0 \
    --check --timeout-s 240 >>"$out.fwd" 2>&1
[ $rc1 = 0 ] && [ $? = 0 ]
t $? "psbench --overlap fwd, --pull-credit 2 (tsm-r18, 2 x 2) exit 0"
for v in "overlap=fwd .* pull_credit=0" "overlap=on .* pull_credit=2" "overlap=fwd .* pull_credit=2"; do
    l=$(grep "^psbench mode=ps servers=2 workers=2 bytes=45526848 .* $v " "$out.fwd")
    wo=$(echo "$l" | sed -n 's/.* wire_out_per_iter=\([0-9]*\).*/\1/p')
    wi=$(echo "$l" | sed -n 's/.* wire_in_per_iter=\([0-9]*\).*/\1/p')
    echo "$l" | grep -q ' check=ok ' && echo "$l" | grep -q ' schedule=flops ' &&
        awk -v o="${wo:-0}" -v i="${wi:-0}" 'BEGIN { g = 45526848
            exit !(o >= g && o < g * 1.01 && i >= g && i < g * 1.01) }'
    t $? "$v: weights == closed form, one gradient out and one in per step ($wo, $wi)"
done
cat "$out.fwd" >>"$out"
rm -f "$out.fwd"
"$b/psbench" --psd "$b/psd" --colocate --servers 1 --workers 1 --bytes 1M >/dev/null 2>&1
[ $? -eq 2 ]
t $? "--colocate without --netns is refused"
"$b/psbench" --psd "$b/psd" --mode ring --workers 2 --overlap fwd --bytes 1M >/dev/null 2>&1
[ $? -eq 2 ]
t $? "--overlap fwd with --mode ring is refused"
"$b/psbench" --model nosuch --psd "$b/psd" >/dev/null 2>&1
[ $? -eq 2 ]
t $? "an unknown --model is refused"

"$b/psbench" --bytes 3 --psd "$b/psd" >/dev/null 2>&1
[ $? -eq 2 ]
t $? "a size that is not a whole number of floats is refused"
"$b/psbench" --help | grep -q -- '--servers'
t $? "--help"

if [ "$fail" != 0 ]; then
    echo "# psbench output:"
    sed 's/^/# /' "$out"
fi
echo "1..$n"
exit $fail
