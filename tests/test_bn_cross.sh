#!/usr/bin/env bash
# Cross-worker BN (--bn sync) with real processes: W = 2 workers of B = 2
# samples each must train exactly as ONE process (--standalone) with
# batch W*B = 4 and plain training-mode BN -- in ring mode (--mode
# allreduce: the BN exchanges ride the job's TCP ring) and in PS mode
# (through a psd: a side ring whose endpoints the workers find through
# server 0) -- for a video model (TSM-ResNet-18, width 8, 4 frames of 32x32)
# and a detector (RetinaNet-R18-FPN with training-mode BN in the whole
# backbone).  Both processes of a step read exactly the samples the single
# process reads (DistributedSampler's shards), dropout is off, and every
# image of the detector's set carries the same two boxes, so each worker
# normalises its losses by the same positive count as the single process
# (the losses are otherwise per-worker means, as SimpleDet's).
#
# Checked against the single process:
#   every gradient (ring mode): one plain SGD step of lr 1e4 from the same weights
#     (st_compare --base: the updates w1 - w0 = lr * mean gradient; lr 1e4
#     puts the rounding of w0 - lr*g, u*|w0|, below 1e-6 of the gradient);
#   the loss of every step (mean of the workers' CSV losses), the weights
#     and the BN running statistics after 3 steps of SGD with momentum, and
#     the video model's logits (--eval --predictions of the saved files);
#   both workers' files bit for bit equal (the group hands every rank the
#     same statistics, so the replicas never drift apart).
# Tolerance 1e-4 of each tensor's scale (norm_rel; logits: of the largest):
# the runs are the same arithmetic in fp32 with other summation orders (the
# workers' BN moments combined in double; the mean of 2 per-worker mean
# gradients against one mean of 4; each conv's weight gradient summed per
# worker), a few units of fp32 rounding (u = 6e-8) of each sum's terms per
# operation, grown through the backward of 18-20 layers whose BNs subtract
# means (cancellation): measured 4e-6 (video) and 7e-6 (detector) for the
# gradients, 1e-5 for 3 steps -- the bound leaves 10x, while the control,
# the same workers with --bn train (each normalising its own 2 samples),
# is off by more than 0.1.
# Failures: a PS-mode worker whose peer did not ask for --bn sync (with the
# same partition table: --bn train --bn-sync 0) is told so, naming the rank; a peer whose advertised address cannot be reached
# is named within seconds (the set-up's 10 s bound).  All runs use one
# compute thread each (two workers share the CI's two cores).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q 'sync: the statistics of every worker' ||
    { echo "1..0 # SKIP psworker without --bn sync"; exit 77; }

TOL=1e-4
"$PSDATA" gen-video --out "$T/vid" --videos 16 --frames 8 --size 32 --seed 3 >/dev/null 2>"$T/gen.err" &&
    "$PSDATA" gen-det --out "$T/det" --images 8 --val-images 1 --size 64 --seed 2 >/dev/null 2>>"$T/gen.err"
ok $? "psdata wrote a video and a detection dataset" || show_log "$T/gen.err"
# the detector's annotations: every image the same two boxes
{
    printf '{"images":['
    for i in 1 2 3 4 5 6 7 8; do
        printf '%s{"id":%d,"width":64,"height":64,"file_name":"%06d.jpg"}' "$([ $i -gt 1 ] && echo ,)" $i $i
    done
    printf '],"annotations":['
    for i in 1 2 3 4 5 6 7 8; do
        printf '%s{"id":%d,"image_id":%d,"category_id":1,"bbox":[8,8,24,20],"area":480,"iscrowd":0},' \
            "$([ $i -gt 1 ] && echo ,)" $((2 * i - 1)) $i
        printf '{"id":%d,"image_id":%d,"category_id":2,"bbox":[34,30,22,26],"area":572,"iscrowd":0}' \
            $((2 * i)) $i
    done
    printf '],"categories":[{"id":1,"name":"a"},{"id":2,"name":"b"}]}\n'
} >"$T/same.json"

VIDEO=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0
       --train-list "$T/vid/train.txt" --root "$T/vid")
DET=(--model retinanet-r18 --width 8 --fpn-channels 16 --size 64 --freeze-at 0 --flip 0
     --train-json "$T/same.json" --root "$T/det/train")
COMMON=(--threads 1 --loader-threads 1 --seed 5 --data-seed 9 --partition-bytes 65536 --no-plots)
GRAD=(--steps 1 --momentum 0 --lr 1e4)
# lr 0.02: at 0.05 one step kills every input of a layer3 channel of the
# video model, whose variance is then 0 and its xhat rounding noise times
# 1/sqrt(eps): a gradient any reordering of a sum changes completely (one
# process against itself with 2 threads: 1e-2), which no tolerance can
# tell from a bug
TRAIN=(--steps 3 --momentum 0.9 --lr 0.02)

# ps NAME [flags]: 1 psd + 2 workers into $T/NAME; ring NAME [flags]: a ring of 2
ps() {
    local name=$1 rc; shift
    start_cluster 1 2 --mode sync || return 1
    run_workers 2 "$T/$name" "${COMMON[@]}" --batch 2 "$@"
    rc=$?
    stop_pids
    PIDS=()
    return $rc
}
ring() {
    local name=$1; shift
    RING_PEERS=$(peers_of 2) run_workers 2 "$T/$name" "${COMMON[@]}" --batch 2 "$@"
}
ref() {
    local name=$1; shift
    standalone "$T/$name" "${COMMON[@]}" --batch 4 --bn train "$@"
}
# the mean over the workers' CSVs of each step's loss against the single
# process's, relative to it; prints the worst
losses_match() {
    local dir=$1 refcsv=$2
    paste -d, "$dir/metrics-rank0.csv" "$dir/metrics-rank1.csv" "$refcsv" | awk -F, -v tol=$TOL -v n="$(head -1 "$refcsv" | tr ',' '\n' | wc -l)" '
        NR == 1 { next }
        { m = ($2 + $(n + 2)) / 2; r = $(2 * n + 2); d = m - r; d = d < 0 ? -d : d
          e = d / (r < 0 ? -r : r); if (e > w) w = e; rows++ }
        END { printf "# worst relative loss difference %.3g over %d steps\n", w, rows; exit !(rows > 0 && w <= tol) }'
}

for what in video det; do
    if [ $what = video ]; then M=("${VIDEO[@]}"); else M=("${DET[@]}"); fi
    ref "$what-b0" "${M[@]}" --steps 1 --lr 0 && ref "$what-g0" "${M[@]}" "${GRAD[@]}" &&
        ref "$what-t0" "${M[@]}" "${TRAIN[@]}"
    ok $? "$what: the single process with batch 4 and BN train (base, one step of lr 1e4, 3 steps)"
    BASE=(--base "$T/$what-b0/model.safetensors" "$T/$what-b0/model.safetensors")
    ring "$what-ring-g" "${M[@]}" "${GRAD[@]}" --bn sync
    ok $? "$what, ring mode: 2 workers x 2 with --bn sync, one step of lr 1e4"
    compare "$T/$what-ring-g/model.safetensors" "$T/$what-g0/model.safetensors" $TOL "" "${BASE[@]}"
    ok $? "$what, ring mode: every gradient == the single process's within $TOL"
    for mode in ring ps; do
        $mode "$what-$mode-t" "${M[@]}" "${TRAIN[@]}" --bn sync --save-all-ranks
        n=$(final_value "$T/$what-$mode-t/w0.out" bn_exchanges)
        [ -n "$n" ] && [ "$n" -eq 120 ]
        ok $? "$what, $mode mode: 3 steps with --bn sync, 120 exchanges (20 BNs, forward and backward, 3 steps; final line: ${n:-none})"
        compare "$T/$what-$mode-t/model.safetensors" "$T/$what-t0/model.safetensors" $TOL
        ok $? "$what, $mode mode: weights and BN running statistics after 3 steps == the single process's"
        losses_match "$T/$what-$mode-t" "$T/$what-t0/metrics-standalone.csv"
        ok $? "$what, $mode mode: each step's loss (mean of the workers') == the single process's"
        compare "$T/$what-$mode-t/model-rank1.safetensors" "$T/$what-$mode-t/model.safetensors" 0 "" --bytes
        ok $? "$what, $mode mode: both workers' files are bit for bit the same"
    done
    ring "$what-ctl" "${M[@]}" "${GRAD[@]}" --bn train
    ok $? "$what control: the same 2 workers with --bn train"
    out=$("$STC" "$T/$what-ctl/model.safetensors" "$T/$what-g0/model.safetensors" --tol 0.1 "${BASE[@]}" 2>&1)
    [ $? -eq 1 ]
    ok $? "$what control: each worker normalising its own 2 samples is off by more than 0.1 ($out)"
done

# the video model's logits: --eval of the saved files on the validation list
for f in "$T/video-ring-t" "$T/video-ps-t" "$T/video-t0"; do
    timeout -k 2 50 "$PSW" --eval --weights "$f/model.safetensors" "${VIDEO[@]}" --threads 1 \
        --num-classes 4 --loader-threads 1 --val-list "$T/vid/val.txt" --predictions "$f/pred.csv" \
        >"$f/eval.out" 2>"$f/eval.err" || show_log "$f/eval.err"
done
for mode in ring ps; do
    paste -d, "$T/video-$mode-t/pred.csv" "$T/video-t0/pred.csv" | awk -F, -v tol=$TOL '
        NR == 1 { n = NF / 2; next }
        { for (i = 5; i <= n; i++) { d = $i - $(i + n); d = d < 0 ? -d : d; if (d > w) w = d
              a = $(i + n) < 0 ? -$(i + n) : $(i + n); if (a > mx) mx = a }; rows++ }
        END { printf "# worst logit difference %.3g (largest logit %.3g) over %d videos\n", w, mx, rows
              exit !(rows > 0 && w <= tol * mx) }'
    ok $? "video, $mode mode: the saved model's logits (eval) == the single process's within $TOL of the largest"
done

# PS mode, a worker that did not ask for --bn sync: its peer names it
start_cluster 1 2 --mode sync
mkdir -p "$T/miss"
t0=$(date +%s)
timeout -k 2 60 "$PSW" --servers "$SERVERS" --rank 0 --num-workers 2 --out "$T/miss" "${COMMON[@]}" \
    "${VIDEO[@]}" --batch 2 --steps 2 --bn sync >"$T/miss/w0.out" 2>"$T/miss/w0.err" &
W0=$!
PIDS+=($W0)
timeout -k 2 60 "$PSW" --servers "$SERVERS" --rank 1 --num-workers 2 --out "$T/miss" "${COMMON[@]}" \
    "${VIDEO[@]}" --batch 2 --steps 2 --bn train --bn-sync 0 >"$T/miss/w1.out" 2>"$T/miss/w1.err" &
W1=$!
PIDS+=($W1)
wait $W0
rc=$?
wait $W1
[ $rc -ne 0 ] && grep -q "server 0 knows no BN ring endpoint of rank 1: was it started with --bn sync" "$T/miss/w0.err"
ok $? "PS mode: a peer without --bn sync is named (rank 0 exit $rc)" || show_log "$T/miss/w0.err"
stop_pids
PIDS=()

# PS mode, a peer whose address cannot be reached (TEST-NET-1): named
# within the set-up's bound, on both sides
start_cluster 1 2 --mode sync
mkdir -p "$T/unreach"
t0=$(date +%s)
for r in 0 1; do
    addr=()
    [ $r = 1 ] && addr=(--bn-sync-addr 192.0.2.1)
    timeout -k 2 60 "$PSW" --servers "$SERVERS" --rank $r --num-workers 2 --out "$T/unreach" \
        "${COMMON[@]}" "${VIDEO[@]}" --batch 2 --steps 2 --bn sync "${addr[@]}" \
        >"$T/unreach/w$r.out" 2>"$T/unreach/w$r.err" &
    PIDS+=($!)
    WP[$r]=$!
done
rc0=0 rc1=0
wait "${WP[0]}" || rc0=$?
wait "${WP[1]}" || rc1=$?
dt=$(($(date +%s) - t0))
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $dt -lt 45 ] &&
    grep -q "tcp://192.0.2.1:[0-9]*.*\(not accepting\|never connected\|silent\)" "$T/unreach/w0.err"
ok $? "PS mode: an unreachable peer is named by rank 0 ($(grep -o 'right rank 1 at [^ ]*' "$T/unreach/w0.err" | head -1)), both exit non-zero ($rc0, $rc1) after ${dt} s" ||
    { show_log "$T/unreach/w0.err"; show_log "$T/unreach/w1.err"; }
tap_done
