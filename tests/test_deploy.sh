#!/usr/bin/env bash
# Deployment files (deploy/systemd, deploy/docker, deploy/slurm) checked
# without systemd, Docker or Slurm running:
#  - make install DESTDIR=... places the binaries, units, example configs;
#    the units' ExecStart points at the installed binaries;
#  - systemd-analyze verify passes on both units (skipped where absent),
#    and the hardening is there (ProtectSystem=strict, PrivateTmp,
#    NoNewPrivileges, ...);
#  - docker-compose.yml parses (PyYAML under /usr/bin/python3, else a
#    structural check) and is consistent: 2 psd + 2 psworker, volumes
#    declared, servers/ranks/ports agree;
#  - every flag used in units, compose, the Slurm script and example
#    configs is one the program's --help lists;
#  - the Dockerfiles: bookworm, multi-stage, apt only, the build
#    dependencies of deploy/deps.sh, runtime packages for every library
#    the binaries link (where dpkg can tell);
#  - the Slurm script assigns roles, ranks and addresses (dry run with a
#    stub scontrol).
# TAP output; 77 when the binaries are not built.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PY=${PS_PYTHON:-/usr/bin/python3}
SRC=$top_srcdir
for b in psd psworker psctl; do
    [ -x "$top_builddir/$b" ] || { echo "1..0 # SKIP $top_builddir/$b not built"; exit 77; }
done
T=$(mktemp -d "${TMPDIR:-/tmp}/ps-deploy.XXXXXX")
n=0 fails=0
cleanup() {
    if [ "$fails" -gt 0 ] || [ -n "${KEEP_TMP:-}" ]; then echo "# files kept in $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
    [ "$1" -eq 0 ]
}
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
show() { [ -f "$1" ] && { echo "# --- $1"; tail -n "${2:-15}" "$1" | sed 's/^/#   /'; }; }

# Flags each program accepts, from its own --help ("  --name" / "  --[no-]name").
for p in psd psworker psctl; do
    "$top_builddir/$p" --help 2>&1 | sed -n 's/^  --\(\[no-\]\)\{0,1\}\([a-z0-9-]*\).*/\2/p' | sort -u >"$T/$p.flags"
    echo config >>"$T/$p.flags"
done
# psdata's help lists each command's flags indented under it
"$top_builddir/psdata" --help 2>&1 | sed -n 's/^ *--\([a-z0-9-]*\).*/\1/p' | sort -u >"$T/psdata.flags"
[ "$(wc -l <"$T/psd.flags")" -gt 10 ] && grep -qx checkpoint-dir "$T/psd.flags" &&
    grep -qx servers "$T/psworker.flags" && grep -qx servers "$T/psctl.flags"
ok $? "flag lists read from psd / psworker / psctl --help"
# check_flags PROG WHERE FLAG...: every FLAG (with or without --) is known
check_flags() {
    local prog=$1 where=$2 f bad=0; shift 2
    for f in "$@"; do
        f=${f#--}; f=${f%%=*}; f=${f#no-}
        [ -z "$f" ] && continue
        if ! grep -qx -- "$f" "$T/$prog.flags" && ! grep -qx -- "no-$f" "$T/$prog.flags"; then
            echo "# $where: $prog has no flag --$f"
            bad=1
        fi
    done
    return $bad
}

# ---- make install ------------------------------------------------------------
D=$T/dest
# make check has built everything, so this only copies; were the tree out of
# date, install would relink binaries other tests may be running.
(unset MAKEFLAGS MFLAGS MAKELEVEL; make -q -C "$top_builddir" all >/dev/null 2>&1) ||
    echo "# build tree not up to date: make install rebuilds first"
( unset MAKEFLAGS MFLAGS MAKELEVEL
  make -C "$top_builddir" install DESTDIR="$D" >"$T/install.log" 2>&1 )
ok $? "make install DESTDIR=... succeeds" || show "$T/install.log"
unit_psd=$(find "$D" -path '*/lib/systemd/system/psd@.service' | head -n 1)
unit_psw=$(find "$D" -path '*/lib/systemd/system/psworker@.service' | head -n 1)
[ -n "$unit_psd" ] && [ -n "$unit_psw" ]
ok $? "units installed under PREFIX/lib/systemd/system"
bindir=$(sed -n 's/^ExecStart=\(.*\)\/psd .*/\1/p' "$unit_psd" 2>/dev/null)
res=0
for b in psd psworker psctl; do [ -x "$D$bindir/$b" ] || { echo "# missing $D$bindir/$b"; res=1; }; done
[ -n "$bindir" ] && [ "${bindir#/}" != "$bindir" ] && [ $res = 0 ]
ok $? "psd, psworker, psctl installed in the bindir the units name ($bindir)"
grep -q "^ExecStart=$bindir/psworker " "$unit_psw" 2>/dev/null
ok $? "psworker@.service runs $bindir/psworker"
ex=$(find "$D" -path '*/share/psd/examples/psd.conf.example' | head -n 1)
[ -n "$ex" ] && [ -f "$(dirname "$ex")/psworker.conf.example" ] && [ -f "$(dirname "$ex")/psctl.conf.example" ] &&
    [ -n "$(find "$D" -path '*/share/doc/psd/operations.md')" ]
ok $? "example configs in PREFIX/share/psd/examples, operations.md in docdir"
! grep -q '@[a-z]*@' "$unit_psd" "$unit_psw"
ok $? "no unsubstituted @...@ left in the installed units"

# ---- units: content and systemd-analyze verify ----------------------------------
need() { local f=$1 re; shift; for re in "$@"; do grep -Eq "^$re" "$f" || { echo "# $(basename "$f"): no line matching ^$re"; return 1; }; done; }
need "$unit_psd" 'ExecStart=/.*/psd --config /etc/psd/psd-%i\.conf' 'Restart=on-failure' 'RestartSec=' \
    '(DynamicUser=yes|User=)' 'StateDirectory=psd' 'ProtectSystem=strict' 'ProtectHome=' \
    'PrivateTmp=yes' 'NoNewPrivileges=yes' 'LimitNOFILE=' 'StandardError=journal' 'WantedBy='
ok $? "psd@.service: config path, restart policy, hardening, state dir, journald"
need "$unit_psw" 'ExecStart=/.*/psworker --config /etc/psd/psworker-%i\.conf' 'Restart=on-failure' \
    'RestartSec=' '(DynamicUser=yes|User=)' 'StateDirectory=' 'CacheDirectory=' 'ReadOnlyPaths=' \
    'ProtectSystem=strict' 'PrivateTmp=yes' 'NoNewPrivileges=yes' 'LimitNOFILE=' 'StandardError=journal'
ok $? "psworker@.service: config path, restart policy, hardening, cache dir, read-only data"
# the state directory is where the example config checkpoints
ckdir=$(sed -n 's/^checkpoint-dir *= *//p' "$SRC/deploy/systemd/psd.conf.example")
sdir=/var/lib/$(sed -n 's/^StateDirectory=\([^ ]*\).*/\1/p' "$unit_psd")
[ -n "$ckdir" ] && case $ckdir in "$sdir"|"$sdir"/*) true ;; *) false ;; esac
ok $? "psd.conf.example checkpoints inside the unit's StateDirectory ($ckdir in $sdir)"
res=0
for u in "$unit_psd" "$unit_psw"; do
    prog=$(basename "$u" | sed 's/@.*//')
    # shellcheck disable=SC2046
    check_flags "$prog" "$(basename "$u")" $(sed -n 's/^ExecStart=[^ ]*//p' "$u" | grep -o -- '--[a-z0-9-]*') || res=1
done
ok $res "every flag in the units' ExecStart is in the program's --help"

if command -v systemd-analyze >/dev/null 2>&1; then
    V=$T/units
    mkdir -p "$V"
    # verify checks that ExecStart is executable: point it at DESTDIR
    for u in "$unit_psd" "$unit_psw"; do
        sed "s|^ExecStart=$bindir/|ExecStart=$D$bindir/|" "$u" >"$V/$(basename "$u")"
    done
    ln -sf psd@.service "$V/psd@0.service"
    ln -sf psworker@.service "$V/psworker@1.service"
    (cd "$V" && systemd-analyze verify ./psd@.service ./psworker@.service ./psd@0.service \
        ./psworker@1.service) >"$T/verify.log" 2>&1
    vrc=$?
    # warnings (unknown keys, bad values) do not change the exit status:
    # any line about our units counts as a failure
    grep -E 'psd@|psworker@' "$T/verify.log" >"$T/verify.ours"
    [ $vrc = 0 ] && [ ! -s "$T/verify.ours" ]
    ok $? "systemd-analyze verify: both units clean" || show "$T/verify.log"
    # the check can fail: a unit with a typo must be reported
    sed 's/^PrivateTmp=yes/PrivateTpm=yes/' "$V/psd@.service" >"$V/bad@.service"
    (cd "$V" && systemd-analyze verify ./bad@.service) >"$T/verify-bad.log" 2>&1
    grep -q 'PrivateTpm' "$T/verify-bad.log"
    ok $? "systemd-analyze verify reports a misspelt directive (the check can fail)"
else
    skip "systemd-analyze not installed: units not verified"
    skip "systemd-analyze not installed"
fi

# ---- example configs ---------------------------------------------------------------
res=0
for f in psd psworker psctl; do
    file=$SRC/deploy/systemd/$f.conf.example
    # shellcheck disable=SC2046
    check_flags "$f" "$f.conf.example" $(sed -n 's/^\([a-z0-9_-]*\) *=.*/\1/p' "$file" | tr _ -) || res=1
    grep -q "^\[$f\]" "$file" || { echo "# $file: no [$f] section"; res=1; }
done
ok $res "example configs: [prog] sections, every key is a flag of that program"
# psd and psworker really accept the example files (flags given after win)
"$top_builddir/psd" --config "$SRC/deploy/systemd/psd.conf.example" --help >/dev/null 2>"$T/cfg1.err" &&
"$top_builddir/psworker" --config "$SRC/deploy/systemd/psworker.conf.example" --help >/dev/null 2>"$T/cfg2.err" &&
"$top_builddir/psctl" --config "$SRC/deploy/systemd/psctl.conf.example" --help >/dev/null 2>"$T/cfg3.err"
ok $? "psd / psworker / psctl load their example config files" || { show "$T/cfg1.err"; show "$T/cfg2.err"; show "$T/cfg3.err"; }

# ---- docker-compose.yml --------------------------------------------------------------
C=$SRC/deploy/docker/docker-compose.yml
if [ -x "$PY" ] && "$PY" -c 'import yaml' 2>/dev/null; then
    : >"$T/compose.flags"
    "$PY" - "$C" "$T" "$SRC" >"$T/compose.out" 2>&1 <<'PYEOF'
import os, sys, yaml
path, tmp, src = sys.argv[1:4]
d = yaml.safe_load(open(path))
assert isinstance(d, dict) and isinstance(d.get("services"), dict), "no services mapping"
svcs = d["services"]
vols = set((d.get("volumes") or {}).keys())
def cmd(s):
    c = s.get("command")
    assert isinstance(c, list) and all(isinstance(x, str) for x in c), "command must be an exec-form list"
    return c
def flags(c):
    out, i = {}, 1
    while i < len(c):
        assert c[i].startswith("--"), "positional argument %r" % c[i]
        if i + 1 < len(c) and not c[i + 1].startswith("--"):
            out[c[i][2:]] = c[i + 1]; i += 2
        else:
            out[c[i][2:]] = True; i += 1
    return out
psd = {k: flags(cmd(v)) for k, v in svcs.items() if v.get("command") and cmd(v)[0] == "psd"}
psw = {k: flags(cmd(v)) for k, v in svcs.items() if v.get("command") and cmd(v)[0] == "psworker"}
assert len(psd) == 2, "want 2 psd services, got %s" % sorted(psd)
assert len(psw) == 2, "want 2 psworker services, got %s" % sorted(psw)
ids = sorted(int(f["server-id"]) for f in psd.values())
assert ids == [0, 1], "server ids %s" % ids
for k, f in psd.items():
    assert int(f["num-servers"]) == 2 and int(f["num-workers"]) == 2, k
    ck = f.get("checkpoint-dir")
    assert ck, "%s: no --checkpoint-dir" % k
    mounts = [m.split(":") for m in svcs[k].get("volumes", [])]
    assert any(len(m) >= 2 and m[0] in vols and (ck == m[1] or ck.startswith(m[1].rstrip("/") + "/"))
               for m in mounts), "%s: checkpoint dir %s is not on a named volume" % (k, ck)
ranks = sorted(int(f["rank"]) for f in psw.values())
assert ranks == [0, 1], "ranks %s" % ranks
by_id = {int(f["server-id"]): (k, f) for k, f in psd.items()}
for k, f in psw.items():
    assert int(f["num-workers"]) == 2, k
    eps = f["servers"].split(",")
    assert len(eps) == 2, "%s: servers %s" % (k, eps)
    for i, ep in enumerate(eps):
        assert ep.startswith("tcp://"), ep
        host, port = ep[6:].rsplit(":", 1)
        name, pf = by_id[i]
        assert host in (name, svcs[name].get("hostname")), "%s: server %d is %s, not service %s" % (k, i, host, name)
        assert int(port) == int(pf.get("port", 9100)), "%s: port %s vs psd --port %s" % (k, port, pf.get("port"))
    assert any(m.split(":")[0] in vols for m in svcs[k].get("volumes", [])), "%s: output not on a volume" % k
assert sum(1 for f in psw.values() if "shutdown-servers" in f) == 1, "exactly one worker shuts the servers down"
for k, v in svcs.items():
    for m in v.get("volumes", []):
        src_ = m.split(":")[0]
        assert src_ in vols or src_.startswith((".", "/")), "%s: volume %s not declared" % (k, src_)
    for dep in (v.get("depends_on") or {}):
        assert dep in svcs, "%s depends on unknown %s" % (k, dep)
    b = v.get("build")
    if b:
        ctx = os.path.normpath(os.path.join(os.path.dirname(path), b["context"]))
        assert os.path.isfile(os.path.join(ctx, b["dockerfile"])), "%s: no %s in %s" % (k, b["dockerfile"], ctx)
        assert os.path.isfile(os.path.join(ctx, "configure.ac")), "%s: build context is not the repository root" % k
    assert v.get("image") or b, "%s: neither image nor build" % k
# every flag per program, for the --help check in shell
with open(os.path.join(tmp, "compose.flags"), "w") as out:
    for k, v in svcs.items():
        lists = []
        if v.get("command"): lists.append(cmd(v))
        ep = v.get("entrypoint")
        if isinstance(ep, list): lists.append([x for x in ep if not x.startswith("/")] + (cmd(v) if v.get("command") else []))
        hc = (v.get("healthcheck") or {}).get("test")
        if isinstance(hc, list) and hc and hc[0] in ("CMD", "CMD-SHELL"): lists.append(hc[1:])
        for c in lists:
            if c and c[0] in ("psd", "psworker", "psctl", "psdata"):
                for x in c[1:]:
                    if x.startswith("--"): out.write("%s %s %s\n" % (c[0], k, x))
print("compose ok: psd %s, psworker %s" % (sorted(psd), sorted(psw)))
PYEOF
    ok $? "docker-compose.yml parses (PyYAML): 2 psd + 2 psworker, ids/ranks/ports/volumes agree" || show "$T/compose.out"
    res=0
    while read -r prog svc flag; do check_flags "$prog" "compose service $svc" "$flag" || res=1; done <"$T/compose.flags"
    [ -s "$T/compose.flags" ] && [ $res = 0 ]
    ok $? "every flag in the compose commands and healthchecks is in --help"
else
    # structural fallback: no tabs, top-level keys, 2+2 services, known flags
    res=0
    grep -q "$(printf '\t')" "$C" && { echo "# tab in $C"; res=1; }
    for k in services volumes; do grep -q "^$k:" "$C" || { echo "# no top-level $k:"; res=1; }; done
    [ "$(grep -c '\["psd",' "$C")" = 2 ] && [ "$(grep -c '\["psworker",' "$C")" = 2 ] || res=1
    ok $res "docker-compose.yml structure (no PyYAML): 2 psd + 2 psworker commands"
    # shellcheck disable=SC2046
    check_flags psd compose $(grep -v '^[[:space:]]*#' "$C" | grep -o '"--[a-z0-9-]*"' | tr -d '"' | sort -u | while read -r f; do
        grep -qx -- "${f#--}" "$T/psd.flags" "$T/psworker.flags" "$T/psctl.flags" "$T/psdata.flags" 2>/dev/null || echo "$f"; done)
    ok $? "every flag in the compose file is known to one of the programs"
fi

# ---- Dockerfiles ------------------------------------------------------------------------
DF=$SRC/deploy/docker/Dockerfile
res=0
froms=$(grep -Ec '^FROM ' "$DF")
[ "$froms" -ge 2 ] || { echo "# $froms FROM lines: not multi-stage"; res=1; }
if grep -E '^FROM ' "$DF" | grep -vq 'debian:bookworm'; then echo "# a stage is not Debian bookworm"; res=1; fi
grep -Eq '^FROM debian:bookworm[^ ]* AS build' "$DF" || { echo "# no 'AS build' stage"; res=1; }
grep -q -- '--from=build' "$DF" || { echo "# nothing copied from the build stage"; res=1; }
tail_from=$(grep -E '^FROM ' "$DF" | tail -n 1)
case $tail_from in *build*) echo "# the final stage is the build stage"; res=1 ;; esac
ok $res "Dockerfile: multi-stage, every stage FROM debian:bookworm, runtime copies from build"
res=0
for f in "$DF" "$SRC/deploy/docker/Dockerfile.cuda"; do
    if grep -Eiq '(curl|wget|git clone|pip3? install|^ADD +https?:|nvm |go get )' "$f"; then
        echo "# $(basename "$f"): downloads besides apt:"; grep -Ein '(curl|wget|git clone|pip|^ADD )' "$f" | sed 's/^/#   /'; res=1
    fi
    if grep -q 'apt-get install' "$f" && ! grep -q 'no-install-recommends' "$f"; then echo "# $(basename "$f"): apt without --no-install-recommends"; res=1; fi
    grep -q 'rm -rf /var/lib/apt/lists' "$f" || { echo "# $(basename "$f"): apt lists left in the image"; res=1; }
    grep -Eq '^USER [a-z]' "$f" && ! grep -Eq '^USER root' "$f" || { echo "# $(basename "$f"): runs as root"; res=1; }
    grep -Eq '^ENTRYPOINT \[' "$f" || { echo "# $(basename "$f"): no exec-form ENTRYPOINT"; res=1; }
    # every COPY source (outside --from) exists in the repository
    while read -r s; do [ -e "$SRC/$s" ] || [ "$s" = . ] || { echo "# COPY source $s missing"; res=1; }; done \
        < <(grep -E '^COPY ' "$f" | grep -v -- '--from' | awk '{ for (i = 2; i < NF; i++) print $i }')
done
grep -Eq '^FROM .* AS build' "$SRC/deploy/docker/Dockerfile.cuda" && grep -q -- '--with-cuda' "$SRC/deploy/docker/Dockerfile.cuda" || res=1
ok $res "Dockerfiles: apt only, no recommends, lists removed, non-root USER, COPY sources exist; CUDA variant"
# build stage installs what deploy/deps.sh says the build needs
if [ -f "$SRC/deploy/deps.sh" ]; then
    pk=$(sed -n '/^PS_DEBIAN_PACKAGES=/,/"$/p' "$SRC/deploy/deps.sh" | sed 's/PS_DEBIAN_PACKAGES=//; s/["\\]//g')
    build_stage=$(sed -n '/AS build/,/^FROM /p' "$DF")
    res=0
    for p in $pk; do
        [ "$p" = procps ] && continue   # used by scripts, not the build
        grep -qw -- "$p" <<<"$build_stage" || { echo "# build stage lacks $p (deploy/deps.sh)"; res=1; }
    done
    ok $res "Dockerfile build stage installs every build dependency of deploy/deps.sh"
fi
# runtime stage has a package for every library the binaries link directly
if command -v dpkg >/dev/null && command -v objdump >/dev/null && command -v ldd >/dev/null; then
    runtime=$(sed -n '/AS runtime/,$p' "$DF")
    res=0 checked=0
    for b in psd psworker psctl; do
        for lib in $(objdump -p "$top_builddir/$b" | awk '/NEEDED/ { print $2 }'); do
            path=$(ldd "$top_builddir/$b" | awk -v l="$lib" '$1 == l { print $3 }')
            [ -n "$path" ] || continue
            pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -n 1 | cut -d: -f1)
            [ -n "$pkg" ] || continue
            checked=$((checked + 1))
            case $pkg in libc6 | libgcc-s1 | libstdc++6) continue ;; esac  # in debian:bookworm-slim
            grep -qw -- "$pkg" <<<"$runtime" || { echo "# $b needs $lib from $pkg: not in the runtime stage"; res=1; }
        done
    done
    [ $checked -gt 3 ] || { echo "# only $checked libraries mapped to packages"; res=1; }
    ok $res "Dockerfile runtime stage installs the package of every library psd/psworker/psctl link"
else
    skip "dpkg/objdump not available: runtime libraries not checked"
fi
E=$SRC/deploy/docker/entrypoint.sh
sh -n "$E" && [ -x "$E" ] && grep -q 'exec ' "$E"
ok $? "entrypoint.sh: executable, valid sh, execs the program"

# ---- Slurm -----------------------------------------------------------------------------
J=$SRC/deploy/slurm/psd-job.sbatch
bash -n "$J" && grep -q '^#SBATCH --nodes' "$J" && grep -q '^#SBATCH --ntasks-per-node' "$J"
ok $? "psd-job.sbatch: valid bash with #SBATCH directives"
mkdir -p "$T/fakebin"
printf '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 1\necho gpu-a\necho gpu-b\necho gpu-c\n' >"$T/fakebin/scontrol"
chmod +x "$T/fakebin/scontrol"
PATH=$T/fakebin:$PATH PSD_DRY_RUN=1 PSD_NUM_SERVERS=2 SLURM_JOB_NODELIST='gpu-[a-c]' SLURM_NTASKS=9 \
    SLURM_NNODES=3 SLURM_NTASKS_PER_NODE='3(x3)' SLURM_JOB_ID=42 PSD_RUN_DIR=$T/slurmrun \
    bash "$J" --steps 10 >"$T/slurm.out" 2>&1
src=$?
grep '^task ' "$T/slurm.out" >"$T/slurm.tasks"
# expected: tasks 0 and 3 are psd 0 and 1; the other 7 are workers 0..6
if ! "$PY" -c '' 2>/dev/null; then
    # no Python here: the same checks in awk
    awk -v FS=': ' '
        function arg(f,   i) { for (i = 1; i < n; i++) if (c[i] == f) return c[i + 1]; return "" }
        { split($1, h, " "); t = h[2]; n = split($2, c, " "); seen[t] = 1
          if (c[1] ~ /psd$/) { ps[t] = arg("--server-id"); if (arg("--num-workers") != 7 || arg("--num-servers") != 2) bad = "psd sizes " t }
          else { r[++nw] = arg("--rank"); if (arg("--servers") != "tcp://gpu-a:9100,tcp://gpu-b:9100" || arg("--num-workers") != 7 || c[n-1] " " c[n] != "--steps 10") bad = "worker " t
                 for (i = 1; i <= n; i++) if (c[i] == "--shutdown-servers") sd++ } }
        END { for (t = 0; t < 9; t++) if (!seen[t]) bad = "missing task " t
              if (!(0 in ps) || !(3 in ps) || ps[0] != 0 || ps[3] != 1 || length(ps) != 2) bad = "psd tasks"
              for (i = 1; i <= 7; i++) if (r[i] != i - 1) bad = "ranks"
              if (sd != 1) bad = "shutdown-servers count"
              if (bad) { print bad; exit 1 } }' "$T/slurm.tasks" >"$T/slurm.check" 2>&1 || src=1
else
"$PY" - "$T/slurm.tasks" >"$T/slurm.check" 2>&1 <<'PYEOF' || src=1
import sys
tasks = {}
for line in open(sys.argv[1]):
    head, cmd = line.split(": ", 1)
    tasks[int(head.split()[1])] = cmd.split()
assert sorted(tasks) == list(range(9)), sorted(tasks)
def arg(c, f): return c[c.index(f) + 1]
servers = {t: c for t, c in tasks.items() if c[0].endswith("psd")}
assert sorted(servers) == [0, 3], "psd tasks %s" % sorted(servers)
assert [int(arg(servers[t], "--server-id")) for t in (0, 3)] == [0, 1]
workers = [c for t, c in sorted(tasks.items()) if t not in servers]
assert [int(arg(c, "--rank")) for c in workers] == list(range(7)), [arg(c, "--rank") for c in workers]
for c in workers:
    assert arg(c, "--servers") == "tcp://gpu-a:9100,tcp://gpu-b:9100", arg(c, "--servers")
    assert int(arg(c, "--num-workers")) == 7
    assert c[-2:] == ["--steps", "10"]
for c in servers.values():
    assert int(arg(c, "--num-workers")) == 7 and int(arg(c, "--num-servers")) == 2
assert sum("--shutdown-servers" in c for c in workers) == 1
PYEOF
fi
[ $src = 0 ]
ok $? "Slurm dry run: psd on task 0 of nodes 0-1, 7 workers ranked 0..6, server addresses from scontrol" ||
    { show "$T/slurm.out"; show "$T/slurm.check"; }
res=0
while read -r _ _ prog rest; do
    # shellcheck disable=SC2046
    check_flags "$(basename "$prog")" "psd-job.sbatch" $(grep -o -- '--[a-z0-9-]*' <<<"$rest") || res=1
done <"$T/slurm.tasks"
[ -s "$T/slurm.tasks" ] && [ $res = 0 ]
ok $? "every flag the Slurm script passes is in --help"

# ---- docs ------------------------------------------------------------------------------
O=$SRC/docs/operations.md
grep -q 'make install' "$O" && grep -q 'systemctl enable --now psd@0' "$O" && grep -q 'psworker@' "$O" &&
    grep -q 'psctl .*status' "$O" && grep -q 'docker compose' "$O" && grep -q 'sbatch' "$O"
ok $? "docs/operations.md covers install, systemd, psctl, compose and Slurm"

echo "1..$n"
[ "$fails" = 0 ]
