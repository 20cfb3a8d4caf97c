#!/bin/sh
# deploy/netns: three emulated hosts at 200 Mbit/s; every pair connects, one
# TCP stream between two hosts runs at the set rate (+-25%: tbf on both ends
# of each link), an nftables partition cuts a pair and clearing it heals it,
# and tear-down leaves no namespace and no link behind (also when run twice).
srcdir=${top_srcdir:-.}
b=${top_builddir:-.}
nd=$srcdir/deploy/netns
pump=$b/tests/tools/netns_pump
. "$srcdir/tests/lib/netns_lib.sh" || { echo "Bail out! cannot read netns_lib.sh"; exit 99; }
netns_require ip tc nft
[ -x "$pump" ] || { echo "1..0 # SKIP $pump not built"; exit 77; }
prefix=psnt$$
links_before=$(ip -o link | wc -l)
out=${TMPDIR:-/tmp}/test_netns.$$
trap '"$nd/down.sh" $prefix >/dev/null 2>&1; "$nd/down.sh" ${prefix}x >/dev/null 2>&1; rm -f "$out".*' EXIT
trap 'exit 1' INT TERM

netns_up $prefix 3 200mbit "$out.up"
t $rc "up.sh: 3 hosts at 200mbit ($(tail -n 1 "$out.up"))"
[ "$(ip netns list | grep -c "^$prefix-")" = 4 ]
t $? "4 namespaces (3 hosts + the bridge's)"
[ "$(ip -o link | wc -l)" = "$links_before" ]
t $? "nothing added to the caller's namespace"
tc -n $prefix-h1 qdisc show dev eth0 | grep -q 'tbf.*rate 200Mbit'
t $? "host eth0 has tbf 200Mbit"
tc -n $prefix-sw qdisc show dev p1 | grep -q 'tbf.*rate 200Mbit'
t $? "bridge port p1 has tbf 200Mbit (the host's ingress)"

# pump FROM TO SECONDS PORT: prints the receiver's line, status of both
pump() {
    "$nd/run.sh" $prefix-h$2 "$pump" recv 10.213.0.$(($2 + 1)) $4 >"$out.r" 2>&1 &
    rp=$!
    for _ in 1 2 3 4 5 6 7 8 9 10; do grep -q listening "$out.r" && break; sleep 0.1; done
    "$nd/run.sh" $prefix-h$1 "$pump" send 10.213.0.$(($2 + 1)) $4 $3 2>&1
    s1=$?
    wait $rp
    s2=$?
    grep bytes= "$out.r"
    [ $s1 = 0 ] && [ $s2 = 0 ]
}
for pair in "0 1" "1 2" "2 0"; do
    set -- $pair
    l=$(pump $1 $2 0.2 5201)
    t $? "h$1 -> h$2 connects and carries data ($l)"
done

# The cap is what is checked: a stream can only fall short of it when the
# shared CPUs starve the pump (make -j check), so up to three tries, the best
# counts; going over it by more than 25% fails at once.
best=0 tries=""
for port in 5202 5206 5207; do
    l=$(pump 0 2 3 $port)
    mbit=$(echo "$l" | sed -n 's/.*mbit_per_s=\([0-9]*\).*/\1/p')
    mbit=${mbit:-0}
    tries="$tries $mbit"
    [ "$mbit" -gt "$best" ] && best=$mbit
    [ "$mbit" -gt 250 ] && break
    [ "$mbit" -ge 150 ] && break
done
[ "$best" -ge 150 ] && [ "$best" -le 250 ]
t $? "h0 -> h2 one TCP stream at 200 Mbit/s +-25% (Mbit/s per try:$tries)"

"$nd/netfault.sh" $prefix-h0 partition 10.213.0.2
t $? "netfault: partition h0 from h1"
"$nd/run.sh" $prefix-h1 "$pump" recv 10.213.0.2 5203 >"$out.r" 2>&1 &
rp=$!
timeout 3 "$nd/run.sh" $prefix-h0 "$pump" send 10.213.0.2 5203 0.1 >/dev/null 2>&1
[ $? != 0 ]
t $? "h0 cannot reach h1 while partitioned"
kill $rp 2>/dev/null
wait $rp 2>/dev/null
l=$(pump 0 2 0.2 5204)
t $? "h0 still reaches h2 ($l)"
"$nd/netfault.sh" $prefix-h0 clear
l=$(pump 0 1 0.2 5205)
t $? "after clear h0 reaches h1 again ($l)"

"$nd/down.sh" $prefix
t $? "down.sh"
[ -z "$(ip netns list | grep "^$prefix-")" ]
t $? "no namespace left"
[ "$(ip -o link | wc -l)" = "$links_before" ]
t $? "no link left"
"$nd/down.sh" $prefix
t $? "down.sh again is a no-op"
# a failure half-way (address 10.213.300.1 is refused by ip) removes what
# up.sh had made already
"$nd/up.sh" ${prefix}x 2 10mbit 10.213.300 >/dev/null 2>&1
rc=$?
[ $rc != 0 ] && [ -z "$(ip netns list | grep "^${prefix}x-")" ]
t $? "up.sh failing half-way leaves nothing behind (rc $rc)"
"$nd/up.sh" "bad/prefix" 2 1mbit >/dev/null 2>&1
[ $? = 2 ]
t $? "a bad prefix is refused"

echo "1..$n"
exit $fail
