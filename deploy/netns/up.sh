#!/bin/sh
# Build an emulated cluster: N hosts (network namespaces PREFIX-h0..h<N-1>)
# on one bridge (in namespace PREFIX-sw), each host's link limited to RATE
# in both directions by tbf (host egress on its eth0, host ingress on the
# bridge port's egress).  Addresses NET.1 .. NET.N (/24, default 10.213.0),
# private to the cluster's own bridge.  Needs root (CAP_SYS_ADMIN/NET_ADMIN).
#
#   deploy/netns/up.sh PREFIX N RATE [NET]     RATE in tc units: 200mbit, 1gbit
#
# On any failure everything made so far is removed (deploy/netns/down.sh).
# Exit 0 = up; 2 = bad arguments; 3 = namespaces, bridge, veth or tbf cannot
# be made here at all; 1 = a failure on the way.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
if [ $# -lt 3 ]; then
    sed -n '2,12s/^# \{0,1\}//p' "$0" >&2
    exit 2
fi
prefix=$1 n=$2 rate=$3 net=${4:-10.213.0}
netns_check_prefix "$prefix" || exit 2
case "$n" in '' | *[!0-9]*) echo "up.sh: N '$n' is not a number" >&2; exit 2 ;; esac
if [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
    echo "up.sh: N must be 1..200" >&2
    exit 2
fi
echo "$net" | grep -Eq '^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$' || { echo "up.sh: NET '$net' is not A.B.C" >&2; exit 2; }
# tbf wants a bucket of at least one GSO burst (64 KiB, else it segments)
# and a few ms of rate; its queue (latency) holds 20 ms.
bps=$(echo "$rate" | awk '
    { v = $0; m = 1; s = tolower(v)
      if (s ~ /gbit$/) { m = 1e9; sub(/gbit$/, "", s) } else if (s ~ /mbit$/) { m = 1e6; sub(/mbit$/, "", s) }
      else if (s ~ /kbit$/) { m = 1e3; sub(/kbit$/, "", s) } else if (s ~ /bit$/) { sub(/bit$/, "", s) }
      else { print "bad"; exit } if (s !~ /^[0-9.]+$/) { print "bad"; exit } printf "%.0f\n", s * m }')
if [ "$bps" = bad ] || [ -z "$bps" ] || [ "$bps" -lt 1000 ]; then
    echo "up.sh: RATE '$rate' is not a tc rate like 200mbit / 1gbit" >&2
    exit 2
fi
burst=$((bps / 8 / 500))
[ "$burst" -lt 131072 ] && burst=131072

if netns_list "$prefix" | grep -q .; then
    echo "up.sh: namespaces $prefix-* exist already (deploy/netns/down.sh $prefix)" >&2
    exit 2
fi
ok=0
trap '[ $ok = 1 ] || "$here/down.sh" "$prefix" >/dev/null 2>&1' EXIT
trap 'exit 1' INT TERM HUP

sw=$prefix-sw
if ! ip netns add "$sw" 2>/dev/null; then
    echo "up.sh: cannot create network namespaces here (need root / CAP_SYS_ADMIN)" >&2
    exit 3
fi
die() { echo "up.sh: $*" >&2; exit 1; }
# The first bridge, veth and tbf tell whether this kernel/container has them
# at all (exit 3, a skip for tests) from a failure on the way (exit 1).
missing() { echo "up.sh: $* not available here" >&2; exit 3; }
ip -n "$sw" link set lo up || die "lo in $sw"
ip -n "$sw" link add br0 type bridge || missing "a bridge (in $sw)"
ip -n "$sw" link set br0 up || die "br0 up"
i=0
while [ $i -lt "$n" ]; do
    h=$prefix-h$i
    ip netns add "$h" || die "netns $h"
    ip -n "$h" link set lo up || die "lo in $h"
    if ! ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$h"; then
        [ $i = 0 ] && missing "veth"
        die "veth for $h"
    fi
    ip -n "$sw" link set "p$i" master br0 || die "p$i to br0"
    ip -n "$sw" link set "p$i" up || die "p$i up"
    ip -n "$h" addr add "$net.$((i + 1))/24" dev eth0 || die "address of $h"
    ip -n "$h" link set eth0 up || die "eth0 of $h up"
    for side in "$h eth0" "$sw p$i"; do
        set -- $side
        if ! tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 20ms; then
            [ $i = 0 ] && missing "tc tbf"
            die "tbf on $2 in $1"
        fi
    done
    i=$((i + 1))
done
ok=1
echo "up.sh: $n hosts $prefix-h0..h$((n - 1)) at $rate ($net.1..$net.$n), bridge in $sw"
