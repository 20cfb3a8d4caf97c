#!/usr/bin/env bash
# psworker --eval on a diverged model: a NaN logit compares false with
# everything, so a rank count that only asks "how many classes score
# higher" called every video correct (top-1 1.0).  A weights file whose
# fc.bias is NaN (every logit NaN) must give top1=0 top5=0, val_loss=nan,
# nonfinite=<all videos> on the final line and pred=-1 in the predictions;
# one NaN element of fc.bias (one class's logit NaN for every video) the
# same.  Control: the unpatched file gives finite numbers and no nonfinite=.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
command -v od >/dev/null && command -v dd >/dev/null || { echo "1..0 # SKIP od / dd missing"; exit 77; }

"$PSDATA" gen-video --out "$T/ds" --videos 16 --frames 8 --size 32 --seed 3 --val-fraction 0.5 \
    >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 16-video dataset (8 for validation)"
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --flip 0 --dropout 0 --threads 1
       --loader-threads 1 --num-classes 4 --val-clips 1)
standalone "$T/train" "${MODEL[@]}" --train-list "$T/ds/train.txt" --root "$T/ds" --lr 0.01 \
    --steps 1 --batch 2 --seed 5
ok $? "1 training step wrote model.safetensors"
W=$T/train/model.safetensors
nval=$(wc -l <"$T/ds/val.txt")

# nan_bias FILE [COUNT]: overwrite the first COUNT (default all) floats of
# fc.bias with a quiet NaN, in place (safetensors: u64 LE header length,
# JSON header, data; offsets in the header are relative to the data).
nan_bias() {
    local f=$1 hl hdr ent a b n i
    hl=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
    hdr=$(head -c $((8 + hl)) "$f" | tail -c "$hl")
    ent=$(grep -o '"fc.bias":{[^}]*}' <<<"$hdr")
    a=$(sed -n 's/.*"data_offsets":\[\([0-9]*\),\([0-9]*\)\].*/\1/p' <<<"$ent")
    b=$(sed -n 's/.*"data_offsets":\[\([0-9]*\),\([0-9]*\)\].*/\2/p' <<<"$ent")
    [ -n "$a" ] && [ -n "$b" ] && grep -q '"F32"' <<<"$ent" || return 1
    n=$(((b - a) / 4))
    [ -n "${2:-}" ] && n=$2
    for ((i = 0; i < n; i++)); do
        printf '\000\000\300\177' | dd of="$f" bs=1 seek=$((8 + hl + a + 4 * i)) conv=notrunc 2>/dev/null || return 1
    done
}

# evaluate NAME FILE: psworker --eval, final line in $T/NAME.out
evaluate() {
    timeout -k 2 "${WORKER_TIMEOUT:-50}" "$PSW" --eval --weights "$2" "${MODEL[@]}" \
        --val-list "$T/ds/val.txt" --root "$T/ds" --predictions "$T/$1.csv" --log-level warn \
        >"$T/$1.out" 2>"$T/$1.err" || { show_log "$T/$1.err"; return 1; }
}

evaluate good "$W"
ok $? "--eval of the trained file"
l=$(final_value "$T/good.out" val_loss)
[ -n "$l" ] && [ "$l" != nan ] && [ "$(final_value "$T/good.out" videos)" = "$nval" ] &&
    ! grep -q nonfinite= "$T/good.out"
ok $? "control: finite val_loss=$l, $nval videos, no nonfinite="

for k in all 1; do
    cp "$W" "$T/nan-$k.safetensors"
    nan_bias "$T/nan-$k.safetensors" "${k#all}"
    ok $? "fc.bias: $k element(s) set to NaN"
    evaluate "nan-$k" "$T/nan-$k.safetensors"
    ok $? "--eval of the NaN file ($k)"
    f=$T/nan-$k.out
    t1=$(final_value "$f" top1) t5=$(final_value "$f" top5) vl=$(final_value "$f" val_loss)
    nf=$(final_value "$f" nonfinite)
    [ "$t1" = 0.0000 ] && [ "$t5" = 0.0000 ]
    ok $? "NaN logits ($k) count as wrong: top1=$t1 top5=$t5 (4 classes: top-5 was 1 for any ranking)"
    [ "$vl" = nan ] || [ "$vl" = -nan ]
    ok $? "NaN logits ($k): val_loss=$vl"
    [ "$nf" = "$nval" ]
    ok $? "final line says nonfinite=$nf of $nval videos"
    [ "$(tail -n +2 "$T/nan-$k.csv" | cut -d, -f4 | sort -u)" = -1 ]
    ok $? "predictions ($k): pred=-1 for every video"
done
tap_done
