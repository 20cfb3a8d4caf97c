#!/usr/bin/env bash
# The Grafana dashboard (deploy/grafana/psd-dashboard.json) against what the
# programs export: a psd and a psworker (smoke model, slowed down so it is
# still training) run with --metrics-port, both endpoints are scraped, and
# tests/tools/check_dashboard.py checks that the JSON parses, is importable
# (a Prometheus data source input, unique panel ids) and that every metric
# it queries is one of those the scrapes declare; the example scrape
# config's job names are the ones the dashboard selects.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PY=${PS_PYTHON:-/usr/bin/python3}
"$PY" -c "import json" >/dev/null 2>&1 || { echo "1..0 # SKIP no python3 at $PY"; exit 77; }
DASH=$top_srcdir/deploy/grafana/psd-dashboard.json

read -r PM WM <<<"$(free_ports 2)"
start_psd 0 1 1 --metrics-port "$PM"
ok $? "psd with --metrics-port $PM"
"$PSW" --servers "tcp://127.0.0.1:$PORT_0" --rank 0 --num-workers 1 --steps 100000 --batch 8 \
    --step-sleep-ms 20 --progress-every 0 --metrics-port "$WM" >"$T/w.out" 2>"$T/w.err" &
PIDS+=($!)

# scrape PORT FILE: GET /metrics over bash's /dev/tcp; 0 when it answered 200
scrape() {
    local a
    exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
    printf 'GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n' >&3
    a=$(cat <&3)
    exec 3<&-
    printf '%s\n' "$a" | tr -d '\r' | sed '1,/^$/d' >"$2"
    [[ $a == "HTTP/1.1 200"* ]]
}
for _ in $(seq 1 200); do
    scrape "$WM" "$T/psworker.txt" 2>/dev/null && grep -q '^psworker_steps_total{rank="0"} [1-9]' "$T/psworker.txt" && break
    sleep 0.05
done
grep -q '^psworker_steps_total{rank="0"} [1-9]' "$T/psworker.txt"
ok $? "psworker's /metrics answers while it trains ($(grep -c '^# TYPE' "$T/psworker.txt") families)" ||
    show_log "$T/w.err"
scrape "$PM" "$T/psd.txt" && grep -q '^psd_updates_total [1-9]' "$T/psd.txt"
ok $? "psd's /metrics answers with updates counted ($(grep -c '^# TYPE' "$T/psd.txt") families)"

"$PY" "$top_srcdir/tests/tools/check_dashboard.py" --start "$tap_n" \
    --scrape-config "$top_srcdir/deploy/grafana/prometheus.yml" "$DASH" "$T/psd.txt" "$T/psworker.txt"
rc=$?
[ "$tap_fail" -eq 0 ] && exit $rc
echo "# $tap_fail of the first $tap_n checks failed"
exit 1
