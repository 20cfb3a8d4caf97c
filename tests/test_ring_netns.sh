#!/bin/sh
# psbench --mode ring --netns: the ring's workers in emulated hosts
# (deploy/netns) at 200 Mbit/s.  3 workers reducing 4 MiB of fp32: each
# rank sends 2(W-1)/W x 4 MiB = 5.59 MB per step over its own limited link,
# so a step cannot take less than 5.59e6*8/200e6 = 0.224 s (~0.02 s on
# loopback): the ring's traffic went through the links, every link busy at
# once.  Exit 77 where namespaces cannot be made.
srcdir=${top_srcdir:-.}
b=${top_builddir:-.}
nd=$srcdir/deploy/netns
. "$srcdir/tests/lib/netns_lib.sh" || { echo "Bail out! cannot read netns_lib.sh"; exit 99; }
netns_require ip tc
if [ ! -x "$b/psbench" ]; then
    echo "1..0 # SKIP psbench not built in $b"
    exit 77
fi
prefix=psrn$$
out=${TMPDIR:-/tmp}/test_ring_netns.$$
trap '"$nd/down.sh" $prefix >/dev/null 2>&1; rm -f "$out" "$out".*' EXIT
trap 'exit 1' INT TERM
netns_up $prefix 3 200mbit "$out.up"
t $rc "3 emulated hosts at 200mbit"
"$b/psbench" --mode ring --netns $prefix --workers 3 --bytes 4M --iters 3 --warmup 1 \
    --pump-seconds 0 --timeout-s 120 >"$out" 2>&1
t $? "psbench --mode ring --netns, 3 workers, exits 0"
l=$(grep '^psbench mode=ring servers=0 workers=3 ' "$out")
echo "$l" | grep -q " netns=$prefix "
t $? "ring ran in the namespaces"
med=$(echo "$l" | sed -n 's/.* median_s=\([0-9.]*\) .*/\1/p')
awk -v m="${med:-0}" 'BEGIN { exit !(m >= 0.75 * 0.2237 && m <= 4 * 0.2237) }'
t $? "step time ${med:-?} s is bandwidth-bound (0.224 s at 200 Mbit/s, within -25%/+300%)"
echo "1..$n"
exit $fail
