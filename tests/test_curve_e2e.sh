#!/usr/bin/env bash
# CURVE end to end: one psd with --curve and an allow-list, psctl as the
# client.  An allowed key gets through `psctl status` (and via a config
# file); a key that is not on the list, a wrong server key, and a plain
# client get no answer (timeout, exit 1); bad key files are refused before
# connecting.  TAP; 77 (skip) until psd and psctl are built or without CURVE.
set -u
top_builddir=${top_builddir:-.}
PSD=$top_builddir/psd
PSCTL=$top_builddir/psctl
for b in "$PSD" "$PSCTL"; do
    [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done
"$PSD" --help 2>&1 | grep -q -- '--curve-allow' || { echo "1..0 # SKIP psd without --curve"; exit 77; }

. "$(dirname "$0")/lib/tap_lib.sh" || { echo "Bail out! cannot read lib/tap_lib.sh"; exit 99; }
tap_lib_init curve

if ! "$PSCTL" keygen "$T/srv" >"$T/kg.out" 2>&1; then
    grep -q "without CURVE" "$T/kg.out" && { echo "1..0 # SKIP libzmq without CURVE"; exit 77; }
    echo "not ok 1 - psctl keygen"; show "$T/kg.out"; exit 1
fi
"$PSCTL" keygen "$T/w0" >/dev/null 2>&1 && "$PSCTL" keygen "$T/intruder" >/dev/null 2>&1 \
    && "$PSCTL" keygen "$T/other" >/dev/null 2>&1
ok $? "keys for the server, an allowed worker, an intruder" || exit 1
cp "$T/w0.pub" "$T/allow.txt"

"$PSD" --port 0 --port-file "$T/psd.port" --server-id 0 --num-servers 1 \
    --curve --curve-secret-key "$T/srv.key" --curve-allow "$T/allow.txt" \
    --curve-admin "$T/allow.txt" --log-level info >"$T/psd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do [ -s "$T/psd.port" ] && break; sleep 0.1; done
[ -s "$T/psd.port" ]
ok $? "psd --curve started" || { show "$T/psd.log"; echo "1..$n"; exit 1; }
S=tcp://127.0.0.1:$(cat "$T/psd.port")

run good "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 5000 \
    --curve-server-key "$T/srv.pub" --curve-public-key "$T/w0.pub" --curve-secret-key "$T/w0.key" status
[ $rc = 0 ]
ok $? "allowed key: psctl status answered" || { show "$T/good.out"; show "$T/psd.log"; }

cat >"$T/psctl.conf" <<EOF
[psctl]
curve-server-key = $T/srv.pub
curve-public-key = $T/w0.pub
curve-secret-key = $T/w0.key
EOF
run conf "$PSCTL" --config "$T/psctl.conf" --servers "$S" --interval-ms 0 --timeout-ms 5000 status
[ $rc = 0 ]
ok $? "allowed key from the config file: answered" || show "$T/conf.out"

run intr "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 1000 \
    --curve-server-key "$T/srv.pub" --curve-public-key "$T/intruder.pub" \
    --curve-secret-key "$T/intruder.key" status
[ $rc = 1 ]
ok $? "key not on the allow-list: no answer, exit 1" || show "$T/intr.out"

run wrongsrv "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 1000 \
    --curve-server-key "$T/other.pub" --curve-public-key "$T/w0.pub" --curve-secret-key "$T/w0.key" status
[ $rc = 1 ]
ok $? "wrong server key: no answer, exit 1" || show "$T/wrongsrv.out"

run plain "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 1000 status
[ $rc = 1 ]
ok $? "plain (no CURVE) client: no answer, exit 1" || show "$T/plain.out"

run swapped "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 1000 \
    --curve-server-key "$T/srv.pub" --curve-public-key "$T/w0.key" --curve-secret-key "$T/w0.pub" status
[ $rc != 0 ] && grep -q "does not belong\|w0" "$T/swapped.out"
ok $? "public and secret key swapped: refused, naming the file" || show "$T/swapped.out"

run missing "$PSCTL" --servers "$S" --interval-ms 0 --timeout-ms 1000 \
    --curve-server-key "$T/nope.pub" --curve-public-key "$T/w0.pub" --curve-secret-key "$T/w0.key" status
[ $rc != 0 ] && grep -q "nope.pub" "$T/missing.out"
ok $? "missing server key file: refused, naming it" || show "$T/missing.out"

run half "$PSCTL" --servers "$S" --interval-ms 0 --curve-public-key "$T/w0.pub" status
[ $rc = 2 ]
ok $? "only some CURVE options: bad usage (exit 2)" || show "$T/half.out"

kill -0 "${PIDS[0]}" 2>/dev/null
ok $? "psd still running after the refused clients" || show "$T/psd.log"
echo "1..$n"
[ "$fails" -eq 0 ]
