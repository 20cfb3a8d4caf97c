#!/bin/sh
# Run a command inside one emulated host:
#   deploy/netns/run.sh PREFIX-h<i> cmd [args...]
set -u
[ $# -ge 2 ] || { echo "usage: $0 HOST cmd [args...]" >&2; exit 2; }
case "$1" in
*-h[0-9]* | *-sw) ;;
*) echo "run.sh: '$1' is not a host of deploy/netns (PREFIX-h<i>)" >&2; exit 2 ;;
esac
h=$1
shift
exec ip netns exec "$h" "$@"
