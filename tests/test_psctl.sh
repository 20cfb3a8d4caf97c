#!/usr/bin/env bash
# psctl against a running cluster on loopback: 2 psd shards + 1 smoke
# psworker on free ports; status / checkpoint / export / shutdown, keygen,
# and the failure paths (dead server, missing spec, bad usage).  TAP output;
# 77 (skip) until psd, psworker, psctl and tests/tools/st_compare are built.
# Every process started here is stopped by its pid when the test exits.
set -u
top_builddir=${top_builddir:-.}
PSD=$top_builddir/psd
PSW=$top_builddir/psworker
PSCTL=$top_builddir/psctl
STC=$top_builddir/tests/tools/st_compare
PY=${PS_PYTHON:-/usr/bin/python3}
for b in "$PSD" "$PSW" "$PSCTL" "$STC"; do
    [ -x "$b" ] || { echo "1..0 # SKIP $b not built"; exit 77; }
done

. "$(dirname "$0")/lib/tap_lib.sh" || { echo "Bail out! cannot read lib/tap_lib.sh"; exit 99; }
tap_lib_init psctl

# ---- keygen ---------------------------------------------------------------
run keygen "$PSCTL" keygen "$T/w0"
z85='^[]0-9a-zA-Z.:+=^!/*?&<>()[{}@%$#-]{40}$'  # the Z85 alphabet
pub=$(cat "$T/w0.pub" 2>/dev/null) sec=$(cat "$T/w0.key" 2>/dev/null)
[ $rc = 0 ] && [[ $pub =~ $z85 ]] && [[ $sec =~ $z85 ]] && [ "$pub" != "$sec" ]
ok $? "keygen writes 40-character Z85 public and secret keys"
[ "$(stat -c %a "$T/w0.key" 2>/dev/null)" = 600 ] && [ "$(stat -c %a "$T/w0.pub" 2>/dev/null)" = 644 ]
ok $? "keygen: secret key file is mode 0600, public 0644"
grep -q -F -- "$pub" "$T/keygen.out"
ok $? "keygen prints the public key"
run keygen2 "$PSCTL" keygen "$T/w0"
[ $rc != 0 ] && [ "$(cat "$T/w0.key")" = "$sec" ] && grep -q -- --force "$T/keygen2.out"
ok $? "keygen refuses to overwrite an existing key (names --force)"
(umask 000; "$PSCTL" keygen --force "$T/w0" >/dev/null 2>&1)
[ "$(cat "$T/w0.key")" != "$sec" ] && [ "$(stat -c %a "$T/w0.key")" = 600 ]
ok $? "keygen --force replaces the pair; secret stays 0600 under umask 000"

# ---- usage errors -----------------------------------------------------------
run u1 "$PSCTL" frobnicate
[ $rc = 2 ] && grep -q 'unknown verb' "$T/u1.out"
ok $? "unknown verb: exit 2 with a message"
run u2 env -u PSCTL_SERVERS "$PSCTL" status
[ $rc = 2 ] && grep -q -- '--servers' "$T/u2.out"
ok $? "status without --servers: exit 2 naming --servers"

# ---- a cluster ---------------------------------------------------------------
start_psd() { # ID
    "$PSD" --port 0 --port-file "$T/psd$1.port" --server-id "$1" --num-servers 2 \
        --num-workers 1 --checkpoint-dir "$T/ckpt" --stats-every-s 0 >"$T/psd$1.log" 2>&1 &
    PIDS+=($!)
    eval "PID$1=$!"
    for _ in $(seq 1 200); do
        [ -s "$T/psd$1.port" ] && return 0
        sleep 0.05
    done
    return 1
}
start_psd 0 && start_psd 1
ok $? "two psd started" || { show "$T/psd0.log"; show "$T/psd1.log"; echo "1..$n"; exit 1; }
S=tcp://127.0.0.1:$(tr -dc 0-9 <"$T/psd0.port"),tcp://127.0.0.1:$(tr -dc 0-9 <"$T/psd1.port")
echo "# servers $S"

run st0 "$PSCTL" --servers "$S" --interval-ms 0 status
[ $rc = 0 ] && grep -q '^server 0 .* up ' "$T/st0.out" && grep -q '^server 1 .* up ' "$T/st0.out"
ok $? "status before training: both servers up" || show "$T/st0.out"

# a dead endpoint: exit 1, reported DOWN, within the timeout
run dead "$PSCTL" --servers "$S,tcp://127.0.0.1:1" --timeout-ms 500 --interval-ms 0 status
[ $rc = 1 ] && grep -q '^server 2 .*DOWN' "$T/dead.out" && grep -q '^server 0 .* up ' "$T/dead.out"
ok $? "status with an unreachable server: exit 1, that server DOWN, others up" || show "$T/dead.out"

# training in the background (slowed so the verbs land mid-run)
"$PSW" --servers "$S" --rank 0 --num-workers 1 --model smoke --steps 80 --batch 16 \
    --partition-bytes 2048 --step-sleep-ms 25 --progress-every 0 --out "$T/run" \
    >"$T/worker.log" 2>&1 &
WPID=$!
PIDS+=("$WPID")
for _ in $(seq 1 100); do grep -q '^iteration' "$T/run/metrics-rank0.csv" 2>/dev/null &&
    [ "$(wc -l <"$T/run/metrics-rank0.csv")" -gt 5 ] && break; sleep 0.05; done

run st1 "$PSCTL" --servers "$S" --interval-ms 400 status
rate=$(sed -n 's/^server 0 .*| \([0-9.]*\) updates\/s.*/\1/p' "$T/st1.out")
[ $rc = 0 ] && grep -q 'workers 1/1 live' "$T/st1.out" && grep -q 'table [0-9a-f]\{16\}' "$T/st1.out" &&
    awk -v r="${rate:-0}" 'BEGIN { exit !(r > 0) }'
ok $? "status while training: 1/1 workers live, table hash, updates/s > 0 ($rate)" || show "$T/st1.out"

if [ -x "$PY" ]; then
    run stj "$PSCTL" --servers "$S" --interval-ms 0 --json status
    "$PY" - "$T/stj.out" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["servers"]
assert len(s) == 2 and all(e["up"] for e in s), s
assert [e["stats"]["server_id"] for e in s] == [0, 1]
assert s[0]["stats"]["table_hash"] == s[1]["stats"]["table_hash"]
assert sum(e["stats"]["owned_partitions"] for e in s) >= 2
PYEOF
    ok $? "status --json: valid JSON, both servers, same table hash"
fi

run ck "$PSCTL" --servers "$S" checkpoint
[ $rc = 0 ] && ls "$T"/ckpt/psd-0-*.safetensors >/dev/null 2>&1 && ls "$T"/ckpt/psd-1-*.safetensors >/dev/null 2>&1
ok $? "checkpoint mid-run: both shards wrote a checkpoint" || show "$T/ck.out"

wait "$WPID"
wrc=$?
[ $wrc = 0 ] && [ -s "$T/run/model.safetensors" ]
ok $? "worker finished (model.safetensors written)" || show "$T/worker.log"

# ---- export ------------------------------------------------------------------
run nospec "$PSCTL" --servers "$S" export "$T/x.safetensors"
"$PSCTL" --servers "$S" --interval-ms 0 --json status 2>/dev/null | grep -q '"spec"'
if [ $? = 0 ]; then # this psd's STATS carries the spec: export needs no --spec
    [ $rc = 0 ] && [ -s "$T/x.safetensors" ]
    ok $? "export without --spec takes the spec from STATS" || show "$T/nospec.out"
else
    [ $rc != 0 ] && grep -q -- '--spec' "$T/nospec.out" && [ ! -e "$T/x.safetensors" ]
    ok $? "export without a spec fails and names --spec" || show "$T/nospec.out"
fi

ck0=$(ls "$T"/ckpt/psd-0-*.safetensors | tail -n 1)
run ex "$PSCTL" --servers "$S" export "$T/export.safetensors" --spec "$ck0" --like "$T/run/model.safetensors"
[ $rc = 0 ] && grep -q 'shapes from --like' "$T/ex.out"
ok $? "export with the spec from a psd checkpoint" || show "$T/ex.out"
"$STC" "$T/export.safetensors" "$T/run/model.safetensors" --tol 0 >"$T/cmp.out" 2>&1
ok $? "exported weights == rank 0's final model, bit for bit" || show "$T/cmp.out"

if [ -x "$PY" ]; then
    # the spec as a JSON file (taken from the export's own __metadata__)
    "$PY" - "$T/export.safetensors" "$T/spec.json" "$T/spec3.json" <<'PYEOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
meta = json.loads(b[8:8 + n])["__metadata__"]
assert meta["format"] == "psctl-export-1" and meta["version_min"] == meta["version_max"] == "80", meta
spec = json.loads(meta["spec"])
open(sys.argv[2], "w").write(json.dumps(spec))
spec["num_servers"] = 3
open(sys.argv[3], "w").write(json.dumps(spec))
PYEOF
    ok $? "export metadata: format, versions 80..80, spec"
    run exj "$PSCTL" --servers "$S" export "$T/export1d.safetensors" --spec "$T/spec.json"
    [ $rc = 0 ] && grep -q ', 1-D' "$T/exj.out"
    ok $? "export with a JSON spec file (1-D tensors without --like)" || show "$T/exj.out"
    run ex3 "$PSCTL" --servers "$S" export "$T/bad.safetensors" --spec "$T/spec3.json"
    [ $rc != 0 ] && grep -q '3 servers' "$T/ex3.out" && [ ! -e "$T/bad.safetensors" ]
    ok $? "export refuses a spec for another number of servers" || show "$T/ex3.out"
fi

# ---- shutdown ------------------------------------------------------------------
nck=$(ls "$T"/ckpt/psd-*.safetensors | wc -l)
run sd "$PSCTL" --servers "$S" shutdown
[ $rc = 0 ]
ok $? "shutdown acknowledged by both servers" || show "$T/sd.out"
gone=1
for _ in $(seq 1 100); do
    kill -0 "$PID0" 2>/dev/null || kill -0 "$PID1" 2>/dev/null || { gone=0; break; }
    sleep 0.05
done
wait "$PID0"; r0=$?
wait "$PID1"; r1=$?
[ $gone = 0 ] && [ $r0 = 0 ] && [ $r1 = 0 ]
ok $? "both psd exited with status 0 after SHUTDOWN" || { show "$T/psd0.log"; show "$T/psd1.log"; }
[ "$(ls "$T"/ckpt/psd-*.safetensors | wc -l)" -ge "$nck" ] &&
    grep -q -i 'checkpoint' "$T/psd0.log"
ok $? "servers checkpointed on SHUTDOWN"
run after "$PSCTL" --servers "$S" --timeout-ms 300 --interval-ms 0 status
[ $rc = 1 ]
ok $? "status after shutdown: exit 1 (no server answers)"

echo "1..$n"
[ "$fails" = 0 ]
