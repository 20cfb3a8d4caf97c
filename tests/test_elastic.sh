#!/usr/bin/env bash
# Elastic membership with real processes (worker/psworker/elastic.c,
# server/psd_elastic.c): 2 psd (--num-workers 2 --max-workers 3) and 2
# psworkers (smoke model, --batch 6, --elastic-lr keep-batch: the global
# batch 12 stays).  A third psworker joins the running job (--join); later
# rank 1 gets SIGTERM and leaves gracefully (it asks server 0 to drain it);
# nothing is restarted.  Checked: every worker exits 0; each says the new W
# and batch from the step the change begins at; psctl status shows 3, then
# 2 in the job; the final line's rank_steps adds up (rank 1 stopped at its
# drain step, the joiner started at its join step); a drain below the
# starting count is refused under keep-batch (naming the rule); and rank
# 0's final weights equal an independent model of the same schedule: one
# process (--standalone) with batch 12 reads exactly the same samples each
# step, so 2 -> 3 -> 2 workers must give its weights (1e-5 of each
# tensor's scale: the mean of 2 or 3 per-worker means vs one mean of 12
# rounds differently).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
. "$(dirname "$0")/lib/fault_cluster.sh" || { echo "Bail out! cannot read lib/fault_cluster.sh"; exit 99; }

STEPS=120
COMMON=(--steps $STEPS --batch 6 --lr 0.05 --momentum 0.9 --weight-decay 1e-4 --partition-bytes 2048
        --seed 3 --data-seed 4 --retry-ms 200 --timeout-ms 40000 --step-sleep-ms 15)
start_cluster 2 2 --mode sync --max-workers 3
ok $? "2 psd, 2 workers to start, up to 3"
fc_start_worker 0 "" "$T/run" "${COMMON[@]}" --elastic-lr keep-batch; W0=$WPID; C0=$WCHILD
fc_start_worker 1 "" "$T/run" "${COMMON[@]}" --elastic-lr keep-batch; W1=$WPID; C1=$WCHILD
fc_wait_rows "$T/run/metrics-rank0.csv" 15 >/dev/null
# the two stand still while the third starts, so it joins early whatever the load
kill -STOP "$C0" "$C1"
r_stop=$(csv_rows "$T/run/metrics-rank0.csv")
timeout -k 2 80 "$PSW" --servers "$SERVERS" --join --num-workers 2 --out "$T/run" --progress-every 0 \
    --log-level info "${COMMON[@]}" --elastic-lr keep-batch >"$T/run/w2.out" 2>"$T/run/w2.err" &
WJ=$!
PIDS+=($WJ)
for _ in $(seq 1 1500); do grep -q "joining the running job at step" "$T/run/w2.err" && break; sleep 0.02; done
kill -CONT "$C0" "$C1"
e1=$(sed -n 's/.*joining the running job at step \([0-9]*\).*/\1/p' "$T/run/w2.err" | head -n 1)
# the join takes effect two versions past the newest (psd_elastic.c), so at
# most a few steps past where rank 0 stood still
[ -n "$e1" ] && [ -n "$C0" ] && [ -n "$C1" ] && [ "$e1" -le $((r_stop + 4)) ]
ok $? "a third worker joined the running job while the others stood still: rank 2 from step ${e1:-?} (rank 0 stopped after step $r_stop)"
fc_wait_rows "$T/run/metrics-rank0.csv" $((e1 + 3)) >/dev/null
"$PSCTL" --servers "$SERVERS" status --interval-ms 0 >"$T/status3.out" 2>&1
grep -q "elastic: 3 in the job now, started with 2, at most 3" "$T/status3.out"
ok $? "psctl status: 3 workers in the job" || show_log "$T/status3.out"
fc_wait_rows "$T/run/metrics-rank0.csv" 60 >/dev/null
kill -TERM "$C1"
for _ in $(seq 1 1500); do grep -q "leaves the job at step" "$T/run/w1.err" && break; sleep 0.02; done
"$PSCTL" --servers "$SERVERS" drain 2 >"$T/drain.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "fewer than the 2 the job started with.*--elastic-lr keep-batch" "$T/drain.out"
ok $? "psctl drain down to 1 worker refused under keep-batch, naming the rule (exit $rc)" ||
    show_log "$T/drain.out"
rc=0
wait "$W0" || rc=1
wait "$W1" || rc=1
wait "$WJ" || rc=1
ok $rc "ranks 0, 1 and 2 exit 0 (rank 1 left gracefully on SIGTERM)" ||
    { show_log "$T/run/w0.err"; show_log "$T/run/w1.err"; show_log "$T/run/w2.err"; }
"$PSCTL" --servers "$SERVERS" status --interval-ms 0 >"$T/status2.out" 2>&1
grep -q "elastic: 2 in the job now" "$T/status2.out"
ok $? "psctl status: 2 workers in the job at the end" || show_log "$T/status2.out"
"$PSCTL" --servers "$SERVERS" shutdown >/dev/null 2>&1
grep -h "membership:\|SIGTERM" "$T/run/w0.err" "$T/run/w1.err" | sed 's/^/# /'
e2=$(sed -n 's/.*SIGTERM: leaving the job at step \([0-9]*\).*/\1/p' "$T/run/w1.err" | head -n 1)
[ -n "$e2" ] &&
    grep -q "membership: 3 worker(s) from step $e1, 4 sample(s) each (global batch 12" "$T/run/w0.err" &&
    grep -q "membership: 2 worker(s) from step $e2, 6 sample(s) each" "$T/run/w0.err" &&
    grep -q "membership: rank 1 leaves the job at step $e2" "$T/run/w1.err" &&
    grep -q "membership: 2 worker(s) from step $e2" "$T/run/w2.err"
ok $? "every rank saw W = 3 from step $e1 and W = 2 from step ${e2:-?}, 12 samples a step throughout"
rs=$(final_value "$T/run/w0.out" rank_steps)
[ "$rs" = "$STEPS,$e2,$((STEPS - e1))" ] && [ "$(final_value "$T/run/w2.out" steps)" = $STEPS ] &&
    [ "$(final_value "$T/run/w1.out" steps)" = "$e2" ]
ok $? "rank_steps=$rs: rank 0 all $STEPS, rank 1 up to its drain, rank 2 from its join"
standalone "$T/ref" --steps $STEPS --batch 12 --lr 0.05 --momentum 0.9 --weight-decay 1e-4 \
    --partition-bytes 2048 --seed 3 --data-seed 4
ok $? "the independent model: one process, batch 12, $STEPS steps"
compare "$T/run/model.safetensors" "$T/ref/model.safetensors" 1e-5
ok $? "2 -> 3 -> 2 workers == one process with the same global batch (1e-5 of each tensor's scale)"
tap_done
