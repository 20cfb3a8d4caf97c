# Sourced (POSIX sh) by the tests that build emulated hosts with deploy/netns:
#   netns_require TOOL...          skip (77) unless root and every TOOL exists
#   netns_up PREFIX N RATE LOG     deploy/netns/up.sh; skip (77) where namespaces
#                                  cannot be made (up.sh exit 3); status in $rc
#   t STATUS DESCRIPTION           TAP line; $fail becomes 1 on a failure
# Needs $nd = the deploy/netns directory.
n=0
fail=0

netns_require() {
    if [ "$(id -u)" != 0 ]; then
        echo "1..0 # SKIP needs root for network namespaces"
        exit 77
    fi
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || { echo "1..0 # SKIP $tool not installed"; exit 77; }
    done
}

netns_up() {
    "$nd/up.sh" "$1" "$2" "$3" >"$4" 2>&1
    rc=$?
    if [ $rc = 3 ]; then
        echo "1..0 # SKIP network namespaces cannot be made here: $(cat "$4")"
        exit 77
    fi
}

t() { # t STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fail=1; fi
}
