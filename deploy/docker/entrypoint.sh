#!/bin/sh
# Container entrypoint (run under tini): "psd ...", "psworker ...",
# "psctl ..." run the installed program; anything else runs as given.
# PSD_CONFIG=FILE adds --config FILE in front of psd / psworker / psctl
# flags (flags after it still win).  exec: the program gets the signals.
set -eu
if [ $# -eq 0 ]; then
    set -- psd --help
fi
prog=$1
case $prog in
psd | psworker | psctl)
    shift
    if [ -n "${PSD_CONFIG:-}" ]; then
        [ -r "$PSD_CONFIG" ] || { echo "entrypoint: PSD_CONFIG=$PSD_CONFIG is not readable" >&2; exit 2; }
        exec "/usr/local/bin/$prog" --config "$PSD_CONFIG" "$@"
    fi
    exec "/usr/local/bin/$prog" "$@"
    ;;
*)
    exec "$@"
    ;;
esac
