#!/usr/bin/env bash
# Periodic validation runs on rank 0 only; the other workers wait for it at
# a BARRIER (a header-only message) instead of in the next step's PUSHPULL,
# whose retries would resend whole gradients while rank 0 validates.
# With --retry-ms 250 and a validation pass longer than that, rank 1's debug
# log must show BARRIER resends and no resent PUSHPULL from then on; a control run where rank 0 is slow in
# its steps instead (--step-sleep-ms) shows the same log does catch
# PUSHPULL resends.  Final lines: rank 0 prints val top-1 / top-5
# (val=here), rank 1 prints nan and val=rank0; the run's validation CSV has
# a row per --val-every steps.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q -- '--bn-sync' || { echo "1..0 # SKIP psworker without --bn-sync"; exit 77; }

K=4
"$PSDATA" gen-video --out "$T/ds" --videos 72 --frames 8 --size 32 --seed 5 --val-fraction 0.5 \
    >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 72-video dataset (36 for validation)"
# width 32: one validation pass (36 videos) takes well over 100 ms
MODEL=(--model tsm-r18 --width 32 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --lr 0.01 --seed 5 --data-seed 9 --steps $K --batch 2 --num-classes 4
       --train-list "$T/ds/train.txt" --val-list "$T/ds/val.txt" --root "$T/ds" --retry-ms 250
       --progress-every 0)

# launch OUT RANK0_FLAGS... -- RANK1_FLAGS...: 2 workers against $SERVERS.
# Each is bounded by WORKER_TIMEOUT (300 s) against a hang; a validation pass
# takes ~3 s on a quiet machine and was seen at 25 s under load.
launch() {
    local out=$1 r rc=0; shift
    local f0=() f1=() wp=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do f0+=("$1"); shift; done
    shift
    f1=("$@")
    mkdir -p "$out"
    for r in 0 1; do
        local extra=("${f0[@]}")
        [ $r -eq 1 ] && extra=("${f1[@]}")
        timeout -k 2 "${WORKER_TIMEOUT:-300}" "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 \
            --out "$out" "${MODEL[@]}" "${extra[@]}" >"$out/w$r.out" 2>"$out/w$r.err" &
        wp+=($!)
        PIDS+=($!)
    done
    for r in 0 1; do wait "${wp[$r]}" || { rc=1; show_log "$out/w$r.err"; }; done
    stop_pids
    PIDS=()
    return $rc
}

start_cluster 1 2 --mode sync
# rank 1 sleeps 400 ms per step so it is always the last to push (its
# PUSHPULL is answered at once, whatever the load on the machine), and the
# retry interval (250 ms) stays above what psd needs to sum and apply a
# step even in the ASan build (50 ms was not); 48 clips per validation
# video make a pass take ~4 s on a quiet machine, well over sleep + 2
# retry intervals
launch "$T/v" --val-every 1 --val-clips 32 --log-level info -- --val-every 1 --val-clips 32 \
    --step-sleep-ms 400 --log-level debug
ok $? "2 workers, validation after every step on rank 0"
nval=$(grep -c '^val:' "$T/v/w0.out")
[ "$nval" -eq $((K - 1)) ] && [ "$(grep -c '^val:' "$T/v/w1.out")" -eq 0 ]
ok $? "rank 0 printed $nval val: lines (steps 1..$((K - 1)); the last one is the final line's), rank 1 none"
es=$(sed -n 's/.*eval_s=\([0-9.]*\).*/\1/p' "$T/v/w0.out" | head -n 1)
diag "one validation pass took ${es}s (must exceed --retry-ms 250 for the check to mean anything)"
awk -v e="$es" 'BEGIN { exit !(e >= 0.9) }'
ok $? "a validation pass is longer than rank 1's sleep + 2 retry intervals"
# Counted from rank 1's first BARRIER resend after step 0 started (the
# "epoch =" line; the start barrier and step 0, whose first messages are
# slow, come before): rank 0 is validating after step 0 from then on.
n_b=$(sed -n '/epoch = /,$p' "$T/v/w1.err" | grep -c 'resent BARRIER')
n_pp=$(sed -n '/epoch = /,$p' "$T/v/w1.err" | sed -n '/resent BARRIER/,$p' | grep -c 'resent PUSHPULL')
[ "$n_b" -gt 0 ] && [ "$n_pp" -eq 0 ]
ok $? "rank 1 waited at the BARRIER ($n_b cheap resends) and resent no PUSHPULL after it ($n_pp)"
t0=$(final_value "$T/v/w0.out" top1)
t1=$(final_value "$T/v/w1.out" top1)
v0=$(final_value "$T/v/w0.out" val)
v1=$(final_value "$T/v/w1.out" val)
[ -n "$t0" ] && [ "$t0" != nan ] && [ "$v0" = here ] && [ "$t1" = nan ] && [ "$v1" = rank0 ]
ok $? "final lines: rank 0 top1=$t0 val=$v0, rank 1 top1=$t1 val=$v1"
[ "$(final_value "$T/v/w0.out" bn_crc)" = "$(final_value "$T/v/w1.out" bn_crc)" ]
ok $? "both ranks end with the same BN statistics"
[ "$(csv_rows "$T/v/val.csv")" -eq $K ]
ok $? "val.csv: one row per validation ($K)"

# control: rank 0 slow in its steps, rank 1 waits in PUSHPULL and resends
start_cluster 1 2 --mode sync
launch "$T/c" --step-sleep-ms 1000 --steps 2 -- --log-level debug --steps 2
ok $? "control run: rank 0 sleeps 1000 ms per step"
n_c=$(grep -c 'resent PUSHPULL' "$T/c/w1.err")
[ "$n_c" -gt 0 ]
ok $? "control: the log does show PUSHPULL resends when rank 1 waits in a step ($n_c)"
tap_done
