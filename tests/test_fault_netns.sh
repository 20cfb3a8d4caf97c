#!/bin/sh
# Network faults: two network namespaces joined by a veth pair,
# two psd in one (10.213.N.1), the workers in the other (rank 0 from
# 10.213.N.2, rank 1 from 10.213.N.3), driven by tests/tools/fault_worker (the raw
# sync worker of tests/lib/fault_lib.h; rank-dependent gradients, so the final
# weights are exact only if every push of every rank was applied once).
#  (a) partition: nftables in the servers' namespace drops everything
#      between rank 1 and server 1 for 3 s mid-job, then is removed; the job
#      waits (--on-worker-loss=wait), the worker resends (same request ids,
#      idempotent) and the job finishes: every partition at the right
#      version, weights bitwise exact.
#  (b) 5% packet loss both ways on the workers' veth (netem is not in this
#      kernel: nftables "numgen random mod 100 < 5 drop"; its counter must
#      show drops): the job finishes with the right versions and weights.
# Needs root, ip netns, veth and nftables; exit 77 (skip) otherwise.
# Names are unique per run and everything is removed by the trap, also on
# failure.  Only addresses inside the namespaces created here are used.
B=${top_builddir:-.}
PSD=$B/psd
FW=$B/tests/tools/fault_worker
N=0
fail=0
t() { N=$((N + 1)); if [ "$1" = 0 ]; then echo "ok $N - $2"; else echo "not ok $N - $2"; fail=1; fi; }
skip() { echo "1..0 # SKIP $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root"
command -v ip >/dev/null 2>&1 || skip "no ip(8)"
command -v nft >/dev/null 2>&1 || skip "no nft(8)"
[ -x "$PSD" ] && [ -x "$FW" ] || skip "psd or tests/tools/fault_worker not built"

ID=$$
NSA=psdfA$ID NSB=psdfB$ID
VA=pfa$ID VB=pfb$ID
SUB=10.213.$((ID % 250 + 1))
TMP=$(mktemp -d /tmp/psd-netns-XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    ip netns del "$NSA" 2>/dev/null
    ip netns del "$NSB" 2>/dev/null
    ip link del "$VA" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$NSA" 2>/dev/null || skip "cannot create network namespaces"
ip netns add "$NSB" || skip "cannot create a second namespace"
ip link add "$VA" type veth peer name "$VB" 2>/dev/null || skip "no veth"
ip link set "$VA" netns "$NSA" && ip link set "$VB" netns "$NSB" || skip "cannot move veth"
ip -n "$NSA" addr add "$SUB.1/24" dev "$VA"
ip -n "$NSB" addr add "$SUB.2/24" dev "$VB"
ip -n "$NSB" addr add "$SUB.3/24" dev "$VB"
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set "$VA" up
ip -n "$NSB" link set "$VB" up
ip netns exec "$NSA" nft add table inet psdfault 2>/dev/null || skip "nftables unusable in a namespace"
ip netns exec "$NSA" nft delete table inet psdfault
sleep 0.3 # addresses leave "tentative" state

# start_servers TAG: two psd in NSA; sets P0 P1 (ports)
start_servers() {
    for s in 0 1; do
        rm -f "$TMP/$1.p$s"
        ip netns exec "$NSA" "$PSD" --bind "tcp://$SUB.1" --port 0 --port-file "$TMP/$1.p$s" \
            --server-id $s --num-servers 2 --num-workers 2 --worker-timeout-ms 0 \
            --stats-every-s 0 --log-level info 2>"$TMP/$1.psd$s.log" &
        PIDS="$PIDS $!"
    done
    for i in $(seq 1 300); do
        [ -s "$TMP/$1.p0" ] && [ -s "$TMP/$1.p1" ] && break
        sleep 0.02
    done
    P0=$(cat "$TMP/$1.p0" 2>/dev/null) P1=$(cat "$TMP/$1.p1" 2>/dev/null)
    [ -n "$P0" ] && [ -n "$P1" ]
}

# run_job TAG STEPS: init, two workers in NSB (background), wait; 0 if both ok
run_job_start() {
    ip netns exec "$NSB" "$FW" init --host "$SUB.1" --ports "$P0,$P1" --workers 2 --src "$SUB.2" \
        >"$TMP/$1.init.log" 2>&1 || return 1
    for r in 0 1; do
        ip netns exec "$NSB" "$FW" work --host "$SUB.1" --ports "$P0,$P1" --workers 2 --rank $r \
            --src "$SUB.$((r + 2))" --steps "$2" --retry-ms 1000 --pace-ms "$3" --deadline-s 50 \
            >"$TMP/$1.w$r.log" 2>&1 &
        eval "W$r=\$!"
        PIDS="$PIDS $!"
    done
}
run_job_wait() {
    wait "$W0"; r0=$?
    wait "$W1"; r1=$?
    [ $r0 = 0 ] && [ $r1 = 0 ]
}
stop_servers() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    PIDS=""
}
show() { for f in "$@"; do sed "s|^|# $(basename "$f"): |" "$f" | tail -n 8; done; }

# (a) partition between rank 1 and server 1 for 3 s, healed
STEPS=300
start_servers a; t $? "(a) two psd listening in $NSA"
run_job_start a $STEPS 5; t $? "(a) INIT from $NSB"
sleep 0.5
ip netns exec "$NSA" nft -f - <<EOF
table inet psdfault {
    chain in {
        type filter hook input priority 0; policy accept;
        ip saddr $SUB.3 tcp dport $P1 counter drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        ip daddr $SUB.3 tcp sport $P1 counter drop
    }
}
EOF
t $? "(a) partition rank 1 <-> server 1 installed"
sleep 3
DROPS=$(ip netns exec "$NSA" nft list table inet psdfault | grep -o 'packets [0-9]*' | awk '{s+=$2} END {print s+0}')
ip netns exec "$NSA" nft delete table inet psdfault
t $? "(a) partition healed after 3 s ($DROPS packets dropped)"
[ "$DROPS" -gt 0 ]; t $? "(a) the partition dropped traffic"
run_job_wait; t $? "(a) both workers finished $STEPS steps"
grep -h "^rank" "$TMP"/a.w*.log | sed 's/^/# /'
ip netns exec "$NSB" "$FW" verify --host "$SUB.1" --ports "$P0,$P1" --workers 2 --steps $STEPS \
    --src "$SUB.2" >"$TMP/a.verify.log" 2>&1
t $? "(a) every partition at version $STEPS, weights bitwise exact"
[ $fail = 0 ] || show "$TMP"/a.*.log
stop_servers

# (b) 5% packet loss both ways on the workers' link
STEPS=300
start_servers b; t $? "(b) two psd listening"
ip netns exec "$NSB" nft -f - <<EOF
table inet psdloss {
    chain in {
        type filter hook input priority 0; policy accept;
        iifname "$VB" numgen random mod 100 < 5 counter drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "$VB" numgen random mod 100 < 5 counter drop
    }
}
EOF
t $? "(b) 5% loss installed on $VB"
T0=$(date +%s)
run_job_start b $STEPS 0; t $? "(b) INIT through the lossy link"
run_job_wait; t $? "(b) both workers finished $STEPS steps ($(($(date +%s) - T0)) s)"
grep -h "^rank" "$TMP"/b.w*.log | sed 's/^/# /'
DROPS=$(ip netns exec "$NSB" nft list table inet psdloss | grep -o 'packets [0-9]*' | awk '{s+=$2} END {print s+0}')
[ "$DROPS" -gt 0 ]; t $? "(b) the loss rule dropped $DROPS packets"
ip netns exec "$NSB" nft delete table inet psdloss
ip netns exec "$NSB" "$FW" verify --host "$SUB.1" --ports "$P0,$P1" --workers 2 --steps $STEPS \
    --src "$SUB.2" >"$TMP/b.verify.log" 2>&1
t $? "(b) every partition at version $STEPS, weights bitwise exact"
[ $fail = 0 ] || show "$TMP"/b.*.log
stop_servers
echo "1..$N"
exit $fail
