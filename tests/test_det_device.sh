#!/usr/bin/env bash
# psworker --device for the detector (retinanet-r18): cpu trains as the
# default; --device cuda:0 without a GPU (or in a build without CUDA) is a
# clear error naming the device, exit 2, never a signal; --precision fp16 is
# refused (fp32 only).  With a GPU and a CUDA build, cuda:0 (the CUDA backend
# and the model's CUDA detection layers) trains the same 3 steps as the CPU:
# weights within 2e-3 of each tensor's scale (tests/test_integration_device.sh's
# bound: cuDNN/cuBLAS and the CUDA losses sum in another order).
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }

"$PSDATA" gen-det --out "$T/ds" --images 4 --val-images 2 --size 64 --classes 3 --seed 2 \
    >"$T/gen.out" 2>"$T/gen.err"
ok $? "psdata gen-det wrote a 4 + 2 image dataset"
MODEL=(--model retinanet-r18 --width 8 --fpn-channels 16 --size 64 --freeze-at 0 --threads 1
       --loader-threads 1 --lr 0.01 --seed 5 --data-seed 9 --steps 3 --batch 2
       --partition-bytes 65536 --train-json "$T/ds/annotations/instances_train.json"
       --root "$T/ds/train")

standalone "$T/cpu" "${MODEL[@]}" --device cpu
ok $? "--device cpu trains"
standalone "$T/dflt" "${MODEL[@]}"
compare "$T/dflt/model.safetensors" "$T/cpu/model.safetensors" 0
ok $? "the default device is the CPU (identical weights)"

# (a build without CUDA stops earlier, at --device)
timeout 20 "$PSW" --standalone "${MODEL[@]}" --device cuda:0 --precision fp16 >"$T/fp16.out" \
    2>"$T/fp16.err"
rc=$?
[ $rc = 2 ] && grep -qE -- "--precision fp16: the detector trains in fp32|without CUDA" "$T/fp16.err"
ok $? "--device cuda:0 --precision fp16: exit $rc, the detector is fp32 only" || show_log "$T/fp16.err"

cuda_vs_cpu "2" "${MODEL[@]}"
tap_done
