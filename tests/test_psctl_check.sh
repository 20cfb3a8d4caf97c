#!/usr/bin/env bash
# psctl check, the preflight (worker/tools/psctl_check.c): a good cluster
# passes (exit 0); each misconfiguration it claims to catch is named with
# what to fix and exits 1: a server down, servers listed out of id order or
# with the same id, --num-servers / --num-workers / --mode /
# --checkpoint-every-steps that disagree, a checkpoint directory that takes
# no file, no room for a checkpoint of the model (--spec), CURVE keys the
# server does not accept (and accepted ones pass), a server clock that is
# off (an LD_PRELOAD shim shifts psd's wall clock by 30 s).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }
SHIM=$top_builddir/tests/tools/clock_shift.so
[ -f "$SHIM" ] || { echo "1..0 # SKIP $SHIM not built"; exit 77; }

# check NAME [psctl flags...]: psctl check on $SERVERS; output in $T/NAME.out, status in RC
check() {
    local name=$1; shift
    "$PSCTL" --servers "$SERVERS" --timeout-ms 1500 "$@" check >"$T/$name.out" 2>&1
    RC=$?
}
# stop_all: stop the psd started so far (tests/lib/pids.sh)
stop_all() {
    stop_pids 30
    PIDS=()
    rm -f "$T"/psd*.log
}
mkdir -p "$T/ck0" "$T/ck1"
GOOD0=(--checkpoint-dir "$T/ck0" --checkpoint-every-steps 10)
GOOD1=(--checkpoint-dir "$T/ck1" --checkpoint-every-steps 10)

# ---- a good cluster ----
start_psd 0 2 2 "${GOOD0[@]}" && start_psd 1 2 2 "${GOOD1[@]}"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
check good --num-workers 2
sed 's/^/# /' "$T/good.out"
[ $RC = 0 ] && grep -q "all 2 server(s) ready" "$T/good.out" && ! grep -q '^FAIL' "$T/good.out" &&
    [ "$(grep -c '^ok ' "$T/good.out")" -ge 10 ]
ok $? "good cluster: every check ok, exit 0"
ls "$T/ck0" "$T/ck1" | grep -q preflight
[ $? -ne 0 ]
ok $? "the probe files in the checkpoint directories are gone"

# ---- a server down; the psctl side of --num-workers ----
read -r dead _ < <(free_ports 1)
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1,tcp://127.0.0.1:$dead
check down
[ $RC = 1 ] && grep -q "^FAIL server 2 (tcp://127.0.0.1:$dead): nothing listens there" "$T/down.out" &&
    grep -q "^FAIL server 0 .*runs with --num-servers 2 but --servers lists 3" "$T/down.out"
ok $? "a server down: named with its endpoint, and --num-servers vs the list (exit $RC)" || show_log "$T/down.out"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
check workers --num-workers 3
[ $RC = 1 ] && grep -q "^FAIL server 0 .*runs with --num-workers 2, the workers will have 3" "$T/workers.out"
ok $? "--num-workers of the workers differs from the servers' (exit $RC)" || show_log "$T/workers.out"

# ---- servers listed out of order ----
SERVERS=tcp://127.0.0.1:$PORT_1,tcp://127.0.0.1:$PORT_0
check order
[ $RC = 1 ] && grep -q "^FAIL server 0 .*runs with --server-id 1: --servers must list the servers in id order" "$T/order.out"
ok $? "servers listed out of id order (exit $RC)" || show_log "$T/order.out"
stop_all

# ---- two servers with the same id; modes, sizes, checkpoint settings apart ----
start_psd 0 2 2 "${GOOD0[@]}" && start_psd 1 2 3 --mode async --checkpoint-dir "$T/ck1" --server-id 0 \
    --checkpoint-every-steps 5
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
check apart
[ $RC = 1 ] && grep -q "^FAIL servers 0 and 1 .* both run with --server-id 0" "$T/apart.out" &&
    grep -q "^FAIL num_workers differs: server 0 has 2, server 1 has 3" "$T/apart.out" &&
    grep -q "^FAIL mode differs: .*\"sync\".*\"async\"" "$T/apart.out" &&
    grep -q "^FAIL checkpoint_every_steps differs: server 0 has 10, server 1 has 5" "$T/apart.out"
ok $? "same --server-id twice, --num-workers, --mode and --checkpoint-every-steps apart: each named (exit $RC)" ||
    show_log "$T/apart.out" 20
stop_all

# ---- checkpoint directory: takes no file; no room for the model ----
# (psd refuses to start with a directory it cannot use; here the disk
# holding it goes away under the running server: a file stands there now)
mkdir -p "$T/gone"
start_psd 0 2 2 --checkpoint-dir "$T/gone/ck" && start_psd 1 2 2 "${GOOD1[@]}"
rm -rf "$T/gone" && touch "$T/gone"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
check dir
[ $RC = 1 ] && grep -q "^FAIL server 0 .*checkpoint directory $T/gone/ck does not take a file: mkdir .*Not a directory" "$T/dir.out"
ok $? "a checkpoint directory that cannot be made: named with the cause (exit $RC)" || show_log "$T/dir.out"
# a model of 2 x 2^38 floats (a TiB each): no disk here has room for it
echo '{"tensors":[["big.weight",274877906944,0],["big2.weight",274877906944,0]],"partition_bytes":1099511627776,"num_servers":2,"num_workers":2}' >"$T/spec.json"
check room --spec "$T/spec.json"
[ $RC = 1 ] && grep -q "^FAIL server 1 .*MiB free, one checkpoint of its share needs 2097152.0 MiB (--spec)" "$T/room.out"
ok $? "no room for a checkpoint of the model given by --spec (exit $RC)" || show_log "$T/room.out"
stop_all

# ---- CURVE ----
"$PSCTL" keygen "$T/srv" >/dev/null 2>&1 && "$PSCTL" keygen "$T/adm" >/dev/null 2>&1 &&
    "$PSCTL" keygen "$T/other" >/dev/null 2>&1
ok $? "CURVE keys for a server, an allowed client and another one"
CURVE=(--curve --curve-secret-key "$T/srv.key" --curve-allow "$T/adm.pub")
start_psd 0 1 2 "${CURVE[@]}" --checkpoint-dir "$T/ck0"
SERVERS=tcp://127.0.0.1:$PORT_0
check plain
[ $RC = 1 ] && grep -q "^FAIL server 0 .*accepts connections but does not answer.*--curve-server-key" "$T/plain.out"
ok $? "psd --curve, psctl without keys: 'does not answer', naming the CURVE flags (exit $RC)" || show_log "$T/plain.out"
check stranger --curve-server-key "$T/srv.pub" --curve-public-key "$T/other.pub" --curve-secret-key "$T/other.key"
[ $RC = 1 ] && grep -q "^FAIL server 0 .*does not answer" "$T/stranger.out"
ok $? "a key not in --curve-allow: refused (exit $RC)" || show_log "$T/stranger.out"
check allowed --curve-server-key "$T/srv.pub" --curve-public-key "$T/adm.pub" --curve-secret-key "$T/adm.key"
[ $RC = 0 ] && grep -q '^ok   --curve the same on every server (true)' "$T/allowed.out"
ok $? "an allowed key: every check ok (exit $RC)" || show_log "$T/allowed.out"
stop_all

# ---- a server whose clock is off ----
LD_PRELOAD=$(readlink -f "$SHIM") PS_CLOCK_SHIFT_S=30 start_psd 0 2 2 "${GOOD0[@]}" && start_psd 1 2 2 "${GOOD1[@]}"
SERVERS=tcp://127.0.0.1:$PORT_0,tcp://127.0.0.1:$PORT_1
check clock
[ $RC = 1 ] && grep -q "^FAIL server 0 .*its clock is +[23][0-9]\.[0-9]* s off this host's" "$T/clock.out" &&
    grep -q "^ok   server 1: clock within" "$T/clock.out"
ok $? "a server clock 30 s ahead: named, the other one ok (exit $RC)" || show_log "$T/clock.out"
stop_all
tap_done
