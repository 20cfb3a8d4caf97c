#!/usr/bin/env bash
# psworker --device: cpu (default) trains; a bad device string is a usage
# error; --device cuda:0 on a machine without a GPU (or a build without
# CUDA) fails with a clear message naming the device -- exit 1 or 2, never a
# signal.  On a machine with a GPU (and a CUDA build), cuda:0 must train the
# same steps as the CPU: weights within 2e-3 of the CPU run relative to each
# tensor's scale (cuDNN/cuBLAS sum in another order; docs/cuda.md's
# whole-step gradients agree to ~1e-3 of a tensor's max, and 3 small SGD
# steps do not amplify that), loss finite.  The CPU's convolution kernels
# (--conv-kernels) and precisions (fp16 refused, bf16 only with native
# bf16) too.
. "$(dirname "$0")/lib/integration_common.sh" || { echo "Bail out! cannot read lib/integration_common.sh"; exit 99; }
PSDATA=$top_builddir/psdata
[ -x "$PSDATA" ] || { echo "1..0 # SKIP psdata not built"; exit 77; }
"$PSW" --help 2>&1 | grep -q -- '--device ' || { echo "1..0 # SKIP psworker without --device"; exit 77; }

"$PSDATA" gen-video --out "$T/ds" --videos 12 --frames 4 --size 32 --seed 2 >/dev/null 2>"$T/gen.err"
ok $? "psdata gen-video wrote a 12-video dataset"
MODEL=(--model tsm-r18 --width 8 --size 32 --frames 4 --dropout 0 --threads 1 --loader-threads 1
       --lr 0.02 --seed 5 --data-seed 9 --steps 3 --batch 2 --partition-bytes 65536
       --train-list "$T/ds/train.txt" --root "$T/ds")

standalone "$T/cpu" "${MODEL[@]}" --device cpu
ok $? "--device cpu trains"
standalone "$T/dflt" "${MODEL[@]}"
compare "$T/dflt/model.safetensors" "$T/cpu/model.safetensors" 0
ok $? "the default device is the CPU (identical weights)"

timeout 20 "$PSW" --standalone "${MODEL[@]}" --device gpu7 >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc = 2 ] && grep -q "gpu7" "$T/bad.err"
ok $? "--device gpu7: usage error (exit $rc) naming it" || show_log "$T/bad.err"

timeout 20 "$PSW" --standalone --steps 1 --device cuda:0 >"$T/smoke.out" 2>"$T/smoke.err"
rc=$?
[ $rc = 2 ] && grep -q "smoke model runs on the CPU" "$T/smoke.err"
ok $? "smoke model with --device cuda:0: exit 2, says the smoke model is CPU-only" || show_log "$T/smoke.err"

# The CPU's convolution kernels: measured per layer shape (the tests pin
# the reference row through PS_CONV_KERNELS; --conv-kernels overrides it),
# each choice logged with the rows' times, the kernels that ran summed up
# at the end; a pinned row's run equals the default-pinned one bit for bit.
standalone "$T/auto" "${MODEL[@]}" --conv-kernels auto --log-level info
measured=0 # a build without oneDNN has one row: nothing to time
grep -q 'define PS_HAVE_ONEDNN 1' "$top_builddir/config.h" && measured=1
{ [ $measured = 0 ] || grep -qE 'conv .* fwd: gemm [0-9.]+ ms.* -> (gemm|onednn) ' "$T/auto/w0.err"; } &&
    grep -qE 'CPU convolution kernels: fwd .*; bwd-data .*; bwd-weights ' "$T/auto/w0.err"
ok $? "--conv-kernels auto trains, logs each shape's measured choice (oneDNN builds) and the kernels that ran" ||
    show_log "$T/auto/w0.err"
standalone "$T/gemm" "${MODEL[@]}" --conv-kernels gemm
compare "$T/gemm/model.safetensors" "$T/cpu/model.safetensors" 0
ok $? "--conv-kernels gemm == PS_CONV_KERNELS=gemm (identical weights)"
timeout 20 "$PSW" --standalone "${MODEL[@]}" --conv-kernels fastest >"$T/ck.out" 2>"$T/ck.err"
rc=$?
[ $rc = 2 ] && grep -q -- "--conv-kernels" "$T/ck.err"
ok $? "--conv-kernels fastest: usage error (exit $rc) naming the flag" || show_log "$T/ck.err"

# --precision on the CPU: fp16 never, bf16 only with native bf16 (AVX-512
# BF16 / AMX): a usage error naming why, before any training
timeout 20 "$PSW" --standalone "${MODEL[@]}" --precision fp16 >"$T/p16.out" 2>"$T/p16.err"
rc=$?
[ $rc = 2 ] && grep -q "precision fp16 on --device cpu" "$T/p16.err"
ok $? "--precision fp16 --device cpu: exit $rc, refused by name" || show_log "$T/p16.err"
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    standalone "$T/bf16" "${MODEL[@]}" --precision bf16 --steps 2
    ok $? "--precision bf16 --device cpu trains on this CPU (native bf16)"
else
    timeout 20 "$PSW" --standalone "${MODEL[@]}" --precision bf16 >"$T/pb.out" 2>"$T/pb.err"
    rc=$?
    [ $rc = 2 ] && grep -q "no native bf16" "$T/pb.err"
    ok $? "--precision bf16 --device cpu without native bf16: exit $rc, says why" ||
        show_log "$T/pb.err"
fi

cuda_vs_cpu "1 2" "${MODEL[@]}"
tap_done
