#!/bin/sh
# Faults on one emulated host, with nftables inside its namespace (netem is
# not available in this kernel):
#   deploy/netns/netfault.sh HOST loss PCT        drop PCT% of packets both ways
#   deploy/netns/netfault.sh HOST partition ADDR  drop everything to/from ADDR
#   deploy/netns/netfault.sh HOST clear           remove the faults
set -u
[ $# -ge 2 ] || { sed -n '2,6s/^# \{0,1\}//p' "$0" >&2; exit 2; }
h=$1 what=$2
case "$h" in *-h[0-9]*) ;; *) echo "netfault.sh: '$h' is not PREFIX-h<i>" >&2; exit 2 ;; esac
nftx() { ip netns exec "$h" nft "$@"; }
setup() {
    nftx list table inet psfault >/dev/null 2>&1 && return 0
    nftx add table inet psfault &&
        nftx add chain inet psfault in '{ type filter hook input priority 0; }' &&
        nftx add chain inet psfault out '{ type filter hook output priority 0; }'
}
case "$what" in
loss)
    pct=${3:-}
    case "$pct" in '' | *[!0-9]*) echo "netfault.sh: loss PCT (0-100)" >&2; exit 2 ;; esac
    setup || exit 1
    for c in in out; do nftx add rule inet psfault $c numgen random mod 100 lt "$pct" drop || exit 1; done
    ;;
partition)
    a=${3:-}
    echo "$a" | grep -Eq '^[0-9]{1,3}(\.[0-9]{1,3}){3}$' || { echo "netfault.sh: partition ADDR" >&2; exit 2; }
    setup || exit 1
    nftx add rule inet psfault in ip saddr "$a" drop && nftx add rule inet psfault out ip daddr "$a" drop
    ;;
clear)
    nftx delete table inet psfault 2>/dev/null
    exit 0
    ;;
*)
    echo "netfault.sh: unknown fault '$what'" >&2
    exit 2
    ;;
esac
