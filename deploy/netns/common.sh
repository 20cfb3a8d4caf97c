# Shared by the deploy/netns scripts (sourced).  Naming: every namespace of
# one emulated cluster starts with PREFIX-: PREFIX-sw holds the bridge, and
# PREFIX-h<i> is host i with eth0 = NET.<i+1>/24.  Nothing is made in, or
# routed to, the caller's namespace.
netns_check_prefix() {
    case "$1" in
    '' | *[!a-z0-9_]*)
        echo "netns: prefix '$1' must be non-empty [a-z0-9_]" >&2
        return 2
        ;;
    esac
    if [ ${#1} -gt 24 ]; then
        echo "netns: prefix '$1' longer than 24 characters" >&2
        return 2
    fi
}

# Namespaces of one cluster (exact prefix match: psn1 does not take psn12's).
netns_list() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|h[0-9]+)\$"
}
