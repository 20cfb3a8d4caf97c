#!/bin/sh
# Tear an emulated cluster down: kill what runs in its namespaces (only
# processes inside PREFIX-* namespaces, which this tooling made) and delete
# the namespaces (their veths and qdiscs go with them).  Idempotent.
#
#   deploy/netns/down.sh PREFIX
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
netns_check_prefix "$1" || exit 2
for sig in TERM KILL; do
    for ns in $(netns_list "$1"); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -s $sig "$pid" 2>/dev/null; done
    done
    [ $sig = TERM ] && [ -n "$(for ns in $(netns_list "$1"); do ip netns pids "$ns"; done 2>/dev/null)" ] && sleep 1
done
rc=0
for ns in $(netns_list "$1"); do
    ip netns del "$ns" || rc=1
done
exit $rc
