# Sourced by shell tests: a scratch directory $T, TAP helpers, and cleanup of
# every process the test started (append its pid to PIDS).
#   . "$(dirname "$0")/lib/tap_lib.sh"; tap_lib_init NAME
# ok STATUS DESCRIPTION   prints "ok N" / "not ok N", counts failures
# show FILE [LINES]       prints the tail of FILE as TAP comments
# run NAME CMD...         CMD's stdout+stderr to $T/NAME.out, its status in $rc
. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"
PIDS=()
n=0 fails=0

tap_lib_cleanup() {
    stop_pids 30
    if [ "$fails" -gt 0 ] || [ -n "${KEEP_TMP:-}" ]; then echo "# logs kept in $T"; else rm -rf "$T"; fi
}

tap_lib_init() { # NAME: scratch directory prefix
    T=$(mktemp -d "${TMPDIR:-/tmp}/ps-$1.XXXXXX")
    trap tap_lib_cleanup EXIT
    trap 'exit 130' INT TERM
}

ok() { # ok STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
    [ "$1" -eq 0 ]
}
show() { [ -f "$1" ] && { echo "# --- $1"; tail -n "${2:-12}" "$1" | sed 's/^/#   /'; }; }
run() { local name=$1; shift; "$@" >"$T/$name.out" 2>&1; rc=$?; }
