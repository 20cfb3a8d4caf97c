#!/bin/sh
# The prepared one-shot GPU session.  On a machine with a GPU:
#   1. the programs: carried prebuilt ones (bench/gpu_prep.sh, run BEFORE
#      the lease on a machine with the full toolchain: the lent GPU images
#      lack libzmq / protobuf-c / OpenBLAS / autotools, so configure cannot
#      run there), else configure + build for sm_90 only,
#   2. parity: tests/test_cuda_cast, tests/test_cuda_layers (every layer vs
#      the CPU reference in fp32, then conv / linear with fp16 and bf16
#      operands, and the loss scale in xent's backward), tests/test_cuda_det
#      (the detection layers of det_layers.cu), tests/test_cuda_layers3d
#      (conv3d through cuDNN's graph API, 3-D pools), tests/test_cuda_rcnn (the
#      two-stage detectors' RoIAlign, roi_align.cu, Mask R-CNN's deconv and
#      mask loss, the scale, and a whole Faster R-CNN step vs the CPU),
#      tests/test_cuda_half (every
#      layer with half storage of the activations, fp16 and bf16, vs the CPU
#      fp32 layers), tests/test_cuda_half_model (a small TSM-ResNet-18 step
#      with half storage vs the CPU fp32 and the CPU rounding model,
#      worker/engine/backend_half_round.h), `gpu_bench check` (a whole
#      TSM-ResNet-18 step, CPU fp32 vs CUDA fp32 / fp16 / bf16, the latter
#      two with half storage), `gpu_bench rcheck` (a whole RetinaNet-R18-FPN
#      step, CPU vs CUDA fp32),
#   3. a TSM-ResNet-50 training step, 8 clips x 8 frames x 224^2, in fp32,
#      fp16 and bf16 (half storage; PS_CUDA_HALF_STORAGE=0 in the environment
#      times the older fp32-tensor form): clips/s, achieved TFLOP/s vs the measured cuBLAS
#      sgemm / fp16 GemmEx peaks, device memory (peak of the backend's
#      allocations and cudaMemGetInfo); after the ratios, one fp16 run of 3
#      steps with PS_GPU_PROFILE=1: the step's time per layer kind,
#   4. PyTorch's TSM-ResNet-50 step (fp32, and AMP fp16 + channels_last) in
#      the same run, and the ratios (the goals: ours fp16 >= 1.7x ours
#      fp32, >= 1.0x PyTorch AMP),
#   5. RetinaNet-R50-FPN training step, 2 x 3 x 512^2, 80 classes, fp32:
#      ours (`gpu_bench rtime`, detection layers on the GPU: the CUDA table's) and
#      torchvision's RetinaNet with the same backbone / FPN / heads (frozen
#      BN, P6 on C5, conv1 + layer1 frozen, TF32 off) in the same run, images/s
#      and the ratio,
#   6. optional: tests/test_nccl,
#   7. cross-worker BN and memory (earlier: tests/test_cuda_bn_group among the
#      parity stages, `gpu_bench check -r` with recomputation, the fp16 step
#      with -r timed): bench/gpu_bnmem.sh, 2 GPU workers with --bn sync vs
#      one process, a two-stage detector's peak memory vs torchvision AMP.
# Every stage has a timeout, clipped so the whole run ends within
# PS_GPU_CHECK_BUDGET seconds (default 540: a 600 s device call with room to
# return the files).  Logs go to $OUT/gpu_check/ when $OUT is set (the
# device tool brings that folder back), else BUILD_DIR/gpu_check/.
#
# Device call (after bench/gpu_prep.sh here):
#   run(command="bench/gpu_check.sh", carry=["tests/test_cuda_carry"], timeout_s=600)
#
#   bench/gpu_check.sh [BUILD_DIR]      (default /tmp/ps-gpu-build)
# Exit status: 0 all good, 1 a stage failed, 77 no GPU.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-/tmp/ps-gpu-build}
J=$(nproc 2>/dev/null || echo 4)
T0=$(date +%s)
BUDGET=${PS_GPU_CHECK_BUDGET:-540}
W=${OUT:+$OUT/gpu_check}
W=${W:-$B/gpu_check}
mkdir -p "$W" "$B" || exit 1
status=0
stage() { printf '\n==== %s (t=%ss)\n' "$1" $(( $(date +%s) - T0 )); }
fail() { echo "FAILED: $1"; status=1; }
# tmo MAX: a stage's timeout, clipped to what is left of the budget; 0
# (and the stage is skipped by `run`) when under 15 s are left.
tmo() {
    left=$(( BUDGET - ($(date +%s) - T0) ))
    if [ "$left" -lt 15 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# run MAX NAME cmd...: output to $W/NAME.out; returns the command's status
# (124 on timeout, 125 when skipped for lack of budget).
run() {
    t=$(tmo "$1"); name=$2; shift 2
    if [ "$t" -eq 0 ]; then echo "SKIPPED (budget of ${BUDGET}s spent): $name"; return 125; fi
    timeout -k 5 "$t" "$@" >"$W/$name.out" 2>&1
}

stage "device"
if ! nvidia-smi -L 2>/dev/null; then echo "no GPU (nvidia-smi failed)"; exit 77; fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv 2>/dev/null

# ---- the programs -----------------------------------------------------------
CARRY=$SRC/tests/test_cuda_carry
if [ -x "$CARRY/gpu_bench" ] && [ -x "$CARRY/test_cuda_layers" ]; then
    stage "prebuilt programs (bench/gpu_prep.sh)"
    cat "$CARRY/BUILD_INFO" 2>/dev/null | head -5
    BIN=$CARRY
    CAST=$BIN/test_cuda_cast LAYERS=$BIN/test_cuda_layers BENCH=$BIN/gpu_bench NCCLT=$BIN/test_nccl
    DET=$BIN/test_cuda_det HALF=$BIN/test_cuda_half HALFM=$BIN/test_cuda_half_model
    TABLE=$BIN/test_cuda_table L3D=$BIN/test_cuda_layers3d RCNN=$BIN/test_cuda_rcnn
    BNG=$BIN/test_cuda_bn_group
    # cuDNN / cuBLAS / NCCL: the toolkit's, else PyTorch's pip packages
    LP=$CARRY/lib
    for py in python3 /usr/bin/python3; do
        d=$("$py" -c 'import os, nvidia
for p in nvidia.__path__:
    for s in ("cudnn", "cublas", "nccl", "cuda_runtime", "cu13"):
        l = os.path.join(p, s, "lib")
        if os.path.isdir(l): print(l)' 2>/dev/null | tr '\n' ':')
        [ -n "$d" ] && { LP=$LP:$d; break; }
    done
    export LD_LIBRARY_PATH="$LP:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    # a missing library shows here in a second, not as 5 failed stages
    if ldd "$BENCH" | grep 'not found'; then
        fail "libraries missing for the carried programs (see above)"
        exit 1
    fi
else
    stage "configure + build (sm_90 only; no tests/test_cuda_carry: see bench/gpu_prep.sh)"
    if [ ! -x "$SRC/configure" ]; then
        echo "no configure script in this tree (generated files are not tracked) and no"
        echo "carried programs: run bench/gpu_prep.sh before the lease and carry"
        echo "tests/test_cuda_carry"
        (cd "$SRC" && timeout 120 autoreconf -fi >"$W/autoreconf.out" 2>&1) ||
            { tail -5 "$W/autoreconf.out"; exit 1; }
    fi
    cd "$B" || exit 1
    if [ ! -f Makefile ]; then
        timeout 120 "$SRC/configure" -q \
            NVCC_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90" \
            >"$W/configure.out" 2>&1 || { tail -20 "$W/configure.out"; exit 1; }
    fi
    grep -q '^NVCC = .*nvcc' Makefile || { echo "configure did not find CUDA"; exit 1; }
    make -s proto/ps.pb-c.h >/dev/null 2>&1
    timeout 300 make -s -j"$J" tests/test_cuda_cast tests/test_cuda_layers tests/test_cuda_det \
        tests/test_cuda_half tests/test_cuda_half_model tests/test_cuda_table \
        tests/test_cuda_layers3d tests/test_cuda_rcnn tests/test_cuda_bn_group \
        tests/tools/st_compare bench/gpu_bench psd psworker psdata \
        >"$W/build.out" 2>&1 || { tail -40 "$W/build.out"; exit 1; }
    grep -i 'warning' "$W/build.out" | head -20
    CAST=./tests/test_cuda_cast LAYERS=./tests/test_cuda_layers BENCH=./bench/gpu_bench
    DET=./tests/test_cuda_det HALF=./tests/test_cuda_half HALFM=./tests/test_cuda_half_model
    TABLE=./tests/test_cuda_table NCCLT=./tests/test_nccl L3D=./tests/test_cuda_layers3d
    RCNN=./tests/test_cuda_rcnn BNG=./tests/test_cuda_bn_group
    mkdir -p "$B/bin" && cp psd psworker psdata tests/tools/st_compare "$B/bin/" && BIN=$B/bin
fi

# ---- parity ---------------------------------------------------------------
stage "test_cuda_cast"
run 60 cast "$CAST"; rc=$?
grep -v '^ok' "$W/cast.out" | tail -15
[ $rc -eq 0 ] || fail "test_cuda_cast (rc $rc)"

# layer_parity MAX NAME PROGRAM SHOWN WORST: one of the per-layer CUDA-vs-CPU
# tests: its failures and last SHOWN lines of output, its WORST largest
# errors; a program missing from an older carry is said, not failed.
layer_parity() {
    if [ ! -x "$3" ]; then
        echo "no $(basename "$3") (carried programs from before it existed: rerun bench/gpu_prep.sh)"
        return
    fi
    run "$1" "$2" "$3"; rc=$?
    grep -v '^ok\|^#  ' "$W/$2.out" | tail -"$4"
    echo "-- worst errors:"; grep '^#   .*max |err|' "$W/$2.out" | sort -t'|' -k3 -g | tail -"$5"
    [ $rc -eq 0 ] || fail "$(basename "$3") (rc $rc)"
}

stage "test_cuda_layers (every layer vs the CPU; conv/linear fp16 + bf16; loss scale)"
layer_parity 150 layers "$LAYERS" 40 8

stage "test_cuda_table (the CUDA backend table and device row: open, events, memory, release)"
layer_parity 30 table "$TABLE" 10 0

stage "test_cuda_layers3d (3-D layers vs the CPU: conv3d through cuDNN's graph API in fp32 / fp16 / bf16, pools)"
layer_parity 90 layers3d "$L3D" 25 5

stage "test_cuda_det (detection layers vs the CPU references)"
layer_parity 60 det "$DET" 25 5

stage "test_cuda_rcnn (RoIAlign, Mask R-CNN's deconv and mask loss vs the CPU reference; a whole Faster R-CNN-R18-FPN step, CPU vs CUDA fp32)"
layer_parity 60 rcnn "$RCNN" 15 4

stage "test_cuda_half (half storage: every layer on fp16 / bf16 NHWC activations vs the CPU)"
layer_parity 60 half "$HALF" 25 5

stage "test_cuda_bn_group (cross-worker BN, --bn sync: 3-8 ranks on one GPU vs PyTorch's SyncBatchNorm math)"
layer_parity 60 bn_group "$BNG" 20 5

stage "test_cuda_half_model (small TSM-ResNet-18 step, half storage vs CPU fp32 and the CPU rounding model, loss scale 1024 and 65536)"
if [ -x "$HALFM" ]; then
    run 60 halfm "$HALFM"; rc=$?
    grep -v '^ok' "$W/halfm.out" | tail -30
    grep '^ok' "$W/halfm.out" | grep 'worst\|rel\|overflow' | tail -40
    [ $rc -eq 0 ] || fail "test_cuda_half_model (rc $rc)"
else
    echo "no test_cuda_half_model (carried programs from before it existed: rerun bench/gpu_prep.sh)"
fi

for p in fp32 fp16 bf16; do
    stage "whole TSM-ResNet-18 step, CPU fp32 vs CUDA $p (fp16/bf16: half storage)"
    run 90 "check_$p" "$BENCH" check -p $p; rc=$?
    tail -12 "$W/check_$p.out"
    [ $rc -eq 0 ] || fail "gpu_bench check -p $p (rc $rc)"
done

stage "whole TSM-ResNet-18 step, shift place 'block' (identity shifted too), CPU fp32 vs CUDA fp32"
run 90 check_block "$BENCH" check -b; rc=$?
tail -12 "$W/check_block.out"
[ $rc -eq 0 ] || fail "gpu_bench check -b (rc $rc)"

for p in fp32 fp16; do
    stage "whole TSM-ResNet-18 step with --recompute (stages and BN + ReLU recomputed), CPU fp32 vs CUDA $p"
    run 90 "check_recompute_$p" "$BENCH" check -r -p $p; rc=$?
    tail -8 "$W/check_recompute_$p.out"
    [ $rc -eq 0 ] || fail "gpu_bench check -r -p $p (rc $rc)"
done

stage "whole RetinaNet-R18-FPN step, CPU fp32 vs CUDA fp32"
run 90 rcheck "$BENCH" rcheck; rc=$?
tail -12 "$W/rcheck.out"
[ $rc -eq 0 ] || fail "gpu_bench rcheck (rc $rc)"

# ---- timing ---------------------------------------------------------------
for p in fp32 fp16 bf16; do
    stage "TSM-ResNet-50 training step, ours ($p)"
    run 120 "time_$p" "$BENCH" time -p $p -d 50 -n 8 -H 224 -s 10 -w 3; rc=$?
    cat "$W/time_$p.out"
    [ $rc -eq 0 ] || fail "gpu_bench time -p $p (rc $rc)"
done

stage "PyTorch TSM-ResNet-50 (fp32, AMP fp16 + channels_last)"
PY=""
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PY=$p; break
    fi
done
if [ -n "$PY" ]; then
    export PYTHONUNBUFFERED=1
    run 150 torch "$PY" "$SRC/bench/gpu_bench_torch.py" --clips 8 --frames 8 \
        --size 224 --steps 10 --warmup 3 || fail "gpu_bench_torch.py"
    cat "$W/torch.out"
    # One run each is noisy on a shared GPU host (PyTorch AMP measured 29-39
    # ms across runs of the same script): the goal's ratio comes from three
    # alternating rounds, ours fp16 then PyTorch AMP, medians of each.
    stage "ours fp16 vs PyTorch AMP, 3 alternating rounds (medians)"
    : >"$W/alt.out"
    for i in 1 2 3; do
        run 40 alt_ours "$BENCH" time -p fp16 -d 50 -n 8 -H 224 -s 10 -w 3 &&
            grep '^RESULT precision=fp16' "$W/alt_ours.out" >>"$W/alt.out"
        run 60 alt_torch "$PY" "$SRC/bench/gpu_bench_torch.py" --clips 8 --frames 8 \
            --size 224 --steps 10 --warmup 3 --precisions amp &&
            grep '^RESULT torch precision=amp' "$W/alt_torch.out" >>"$W/alt.out"
    done
    cat "$W/alt.out"
else
    echo "PyTorch with CUDA not importable: skipped"
fi

stage "RetinaNet-R50-FPN training step, 2 x 512^2, 80 classes, fp32: ours"
run 120 rtime "$BENCH" rtime -d 50 -n 2 -H 512 -K 80 -s 5 -w 2; rc=$?
cat "$W/rtime.out"
[ $rc -eq 0 ] || fail "gpu_bench rtime (rc $rc)"

stage "RetinaNet-R50-FPN training step, same shapes: torchvision (fp32, TF32 off)"
if [ -n "$PY" ]; then
    # the same model as ours: ResNet-50 with FrozenBatchNorm2d, conv1 +
    # layer1 frozen, FPN 256 on C3..C5, P6 on C5 (LastLevelP6P7(2048, 256)),
    # 9 anchors, 80 classes, the same two boxes per image; a step is
    # forward (with torchvision's transform and losses) + backward
    run 150 rtorch "$PY" - 2 512 80 10 3 <<'PYEOF' || fail "torchvision RetinaNet step"
import sys, time, torch, torchvision
from torchvision.models.detection import RetinaNet
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.ops.misc import FrozenBatchNorm2d
n, size, K, steps, warm = map(int, sys.argv[1:6])
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
body = torchvision.models.resnet50(weights=None, norm_layer=FrozenBatchNorm2d)
bb = _resnet_fpn_extractor(body, 3, returned_layers=[2, 3, 4],
                           extra_blocks=LastLevelP6P7(2048, 256))
m = RetinaNet(bb, num_classes=K, min_size=size, max_size=size).cuda().train()
dev = torch.device("cuda")
imgs = [torch.rand(3, size, size, device=dev) for _ in range(n)]
s = float(size)
box = torch.tensor([[0.1 * s, 0.1 * s, 0.5 * s, 0.45 * s], [0.4 * s, 0.3 * s, 0.9 * s, 0.95 * s]],
                   device=dev)
tg = [{"boxes": box, "labels": torch.tensor([0, 1 if K > 1 else 0], device=dev)} for _ in range(n)]
ts = []
for it in range(warm + steps):
    for p in m.parameters():
        p.grad = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ld = m(imgs, tg)
    loss = sum(ld.values())
    loss.backward()
    torch.cuda.synchronize()
    if it >= warm:
        ts.append(time.perf_counter() - t0)
ts.sort()
st = ts[len(ts) // 2]
print("torchvision %s, torch %s: RetinaNet-R50-FPN fp32 %d x %d^2, K %d: step %.1f ms, %.2f images/s"
      % (torchvision.__version__, torch.__version__, n, size, K, st * 1e3, n / st))
print("RESULT retina impl=torch images=%d size=%d classes=%d step_ms=%.2f images_s=%.3f mem_gib=%.2f"
      % (n, size, K, st * 1e3, n / st, torch.cuda.max_memory_allocated() / 2**30))
PYEOF
    cat "$W/rtorch.out"
else
    echo "PyTorch with CUDA not importable: skipped"
fi

stage "summary"
val() { sed -n "s/^RESULT $1 .* $2=\([0-9.]*\).*/\1/p" "$W/$3.out" 2>/dev/null | head -n 1; }
o32=$(val "precision=fp32" clips_s time_fp32); o16=$(val "precision=fp16" clips_s time_fp16)
ob16=$(val "precision=bf16" clips_s time_bf16)
t32=$(val "torch precision=fp32" clips_s torch); tamp=$(val "torch precision=amp" clips_s torch)
for p in fp32 fp16 bf16; do
    grep "^RESULT precision=$p" "$W/time_$p.out" 2>/dev/null
done
grep '^RESULT torch' "$W/torch.out" 2>/dev/null
grep '^RESULT retina' "$W/rtime.out" "$W/rtorch.out" 2>/dev/null
rours=$(sed -n 's/^RESULT retina impl=ours .* images_s=\([0-9.]*\).*/\1/p' "$W/rtime.out" 2>/dev/null)
rtv=$(sed -n 's/^RESULT retina impl=torch .* images_s=\([0-9.]*\).*/\1/p' "$W/rtorch.out" 2>/dev/null)
awk -v o32="${o32:-0}" -v o16="${o16:-0}" -v ob="${ob16:-0}" -v t32="${t32:-0}" -v ta="${tamp:-0}" \
    -v ro="${rours:-0}" -v rt="${rtv:-0}" '
    function r(a, b) { return (a > 0 && b > 0) ? sprintf("%.2f", a / b) : "n/a" }
    BEGIN {
        printf "RATIO ours fp16 / ours fp32          = %s  (goal >= 1.7)\n", r(o16, o32);
        printf "RATIO ours bf16 / ours fp32          = %s\n", r(ob, o32);
        printf "RATIO ours fp32 / torch fp32         = %s\n", r(o32, t32);
        printf "RATIO ours fp16 / torch AMP fp16 (CL) = %s  (one run each)\n", r(o16, ta);
        printf "RATIO RetinaNet-R50 ours / torchvision (fp32, images/s) = %s\n", r(ro, rt);
    }' | tee "$W/ratios.txt"
# the goal's ratio from the alternating rounds: median clips/s of each side
med() { sed -n "s/^RESULT $1 .* clips_s=\([0-9.]*\).*/\1/p" "$W/alt.out" 2>/dev/null | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
ao=$(med "precision=fp16"); at=$(med "torch precision=amp")
na=$(grep -c '^RESULT' "$W/alt.out" 2>/dev/null)
[ -n "$ao" ] && [ -n "$at" ] &&
    awk -v a="$ao" -v b="$at" -v n="${na:-0}" 'BEGIN { printf "RATIO ours fp16 / torch AMP, medians of alternating rounds (%d runs: %.1f vs %.1f clips/s) = %.2f  (goal >= 1.0)\n", n, a, b, a / b }' |
    tee -a "$W/ratios.txt"

# memory: the fp16 step with --recompute (the arena's activations half and
# one stage deep), beside the ratios' fp32 / fp16 runs
stage "TSM-ResNet-50 training step, ours (fp16 + --recompute): time and memory"
run 90 time_fp16r "$BENCH" time -p fp16 -r -d 50 -n 8 -H 224 -s 5 -w 2; rc=$?
grep '^RESULT\|memory\|allocations' "$W/time_fp16r.out"
[ $rc -eq 0 ] || fail "gpu_bench time -p fp16 -r (rc $rc)"
for p in fp32 fp16 fp16r; do
    sed -n 's/^RESULT precision=\([a-z0-9]*\) .* alloc_peak_gib=\([0-9.]*\) .*recompute=\([01]\) arena_gib=\([0-9.]*\).*/MEMORY TSM-R50 8x8x224 \1 recompute=\3: backend peak \2 GiB, arena \4 GiB/p' \
        "$W/time_$p.out" 2>/dev/null
done | tee -a "$W/ratios.txt"

# where the fp16 step's time goes, by layer kind (each call drained and
# timed: the split, not the speed; 3 steps, ~30 s; after the summary so
# it never takes budget from the ratios)
stage "TSM-ResNet-50 fp16 step, per layer kind (PS_GPU_PROFILE=1)"
run 60 prof_fp16 env PS_GPU_PROFILE=1 "$BENCH" time -p fp16 -d 50 -n 8 -H 224 -s 3 -w 2; rc=$?
sed -n '/^PROFILE/,$p' "$W/prof_fp16.out" | grep -v '^RESULT'
[ $rc -eq 0 ] || fail "gpu_bench time -p fp16 with PS_GPU_PROFILE=1 (rc $rc)"

# ---- optional: NCCL allreduce ----------------------------------------------
# tests/test_nccl (ps_nccl: rendezvous, failure paths, W=2 exact sum / mean
# in fp32/fp16/bf16; with one GPU NCCL refuses two ranks on it and the W=2
# case is a TAP skip, W=1 still runs).  PS_GPU_CHECK_NCCL=0 skips it.
if [ "${PS_GPU_CHECK_NCCL:-1}" != 0 ]; then
    stage "NCCL allreduce (tests/test_nccl, optional)"
    if [ -x "$NCCLT" ]; then
        run 90 nccl "$NCCLT"; rc=$?
        grep -v '^ok' "$W/nccl.out" | tail -25
        [ $rc -eq 0 ] || [ $rc -eq 77 ] || [ $rc -eq 125 ] || fail "test_nccl (rc $rc)"
    elif [ -f config.h ] && grep -q '^#define PS_HAVE_NCCL 1' config.h &&
         run 90 nccl-build make -s -j"$J" tests/test_nccl; then
        run 90 nccl ./tests/test_nccl; rc=$?
        grep -v '^ok' "$W/nccl.out" | tail -25
        [ $rc -eq 0 ] || [ $rc -eq 77 ] || [ $rc -eq 125 ] || fail "test_nccl (rc $rc)"
    else
        echo "no test_nccl (NCCL not found at build time): skipped"
    fi
fi

# ---- end to end: psd + 2 psworkers training on the GPU ------------------------
# bench/gpu_train.sh: TSM-ResNet-18 on the generated direction dataset in
# fp32, fp16 (dynamic loss scaling) and bf16; the half runs must reach the
# fp32 run's val top-1 (within 0.05, and >= 0.9).  Needs psd / psworker /
# psdata (carried by bench/gpu_prep.sh, or built here).  PS_GPU_CHECK_TRAIN=0
# skips it.
if [ "${PS_GPU_CHECK_TRAIN:-1}" != 0 ]; then
    stage "psworker training on the GPU: TSM-ResNet-18, fp32 / fp16 / bf16 (bench/gpu_train.sh)"
    TB=${BIN:-.}
    if [ -x "$TB/psworker" ] && [ -x "$TB/psd" ] && [ -x "$TB/psdata" ]; then
        run 200 train "$SRC/bench/gpu_train.sh" "$TB" "${PS_GPU_TRAIN_STEPS:-500}"; rc=$?
        grep -v '^ok' "$W/train.out" | tail -20
        [ $rc -eq 0 ] || [ $rc -eq 125 ] || fail "gpu_train.sh (rc $rc)"
    else
        echo "no psworker / psd / psdata next to the test programs: skipped"
    fi
fi

# ---- cross-worker BN and memory (bench/gpu_bnmem.sh): --bn sync with 2 GPU
# workers against one process (fp32 vs the CPU, fp16 vs the GPU), and a
# two-stage detector's peak memory, ours fp32 / fp16 (+ --recompute) against
# torchvision fp32 / AMP.  PS_GPU_CHECK_BNMEM=0 skips it.
if [ "${PS_GPU_CHECK_BNMEM:-1}" != 0 ]; then
    stage "--bn sync on the GPU; detector peak memory vs torchvision AMP (bench/gpu_bnmem.sh)"
    run 240 bnmem "$SRC/bench/gpu_bnmem.sh" "${BIN:-.}" "$W"; rc=$?
    grep 'RESULT\|FAILED\|refused\|skipped' "$W/bnmem.out" | tee -a "$W/ratios.txt"
    [ $rc -eq 0 ] || [ $rc -eq 125 ] || fail "gpu_bnmem.sh (rc $rc)"
fi

stage "done"
echo "total $(( $(date +%s) - T0 )) s, status $status; logs in $W"
exit $status
