#!/bin/sh
# Cross-worker BN, recomputation and memory on a GPU (a stage of
# bench/gpu_check.sh; the programs from bench/gpu_prep.sh or a build):
#   1. --bn sync on the GPU: 2 psworkers on cuda:0 (ring mode over TCP; the
#      BN exchanges go through the host, bn_exchange.cu) with 2 clips each
#      against ONE CPU process with 4 clips and BN train: weights and BN
#      statistics after 3 steps within 2e-3 of each tensor's scale (GPU vs
#      CPU fp32, as tests/lib/integration_common.sh's cuda_vs_cpu); and the
#      same 2 workers in fp16 against one GPU process in fp16 with 4 clips
#      (half storage: 5e-2, the half models' bound);
#   2. a detector's peak device memory: ours (psworker --device cuda:0
#      --standalone, the "device_memory:" line: peak of the backend's own
#      allocations, arena included) in fp32, fp32 + --recompute and, when
#      psworker takes it for the detector, fp16 and fp16 + --recompute;
#      torchvision's same model in fp32 and AMP (torch.cuda.
#      max_memory_allocated) on the same batch: 2 images of 800^2, 3
#      classes.  The model is Mask R-CNN-R50-FPN when psworker knows
#      maskrcnn-r50, else Faster R-CNN-R50-FPN.
# Lines "RESULT bnmem ..." are for gpu_check.sh's summary.
#
#   bench/gpu_bnmem.sh BIN LOGDIR      (BIN: psworker, psd, psdata, st_compare)
set -u
BIN=$1
W=$2
SRC=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/ps-bnmem.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
status=0
fail() { echo "FAILED: $1"; status=1; }
PSW=$BIN/psworker PSDATA=$BIN/psdata STC=$BIN/st_compare
for b in "$PSW" "$PSDATA" "$STC"; do
    [ -x "$b" ] || { echo "no $b: skipped (rerun bench/gpu_prep.sh)"; exit 0; }
done
port() { echo $((20000 + ($$ * 7 + $1 * 131) % 30000)); }

# ---- 1. --bn sync, 2 GPU workers == one process ------------------------------
"$PSDATA" gen-video --out "$T/vid" --videos 16 --frames 8 --size 64 --seed 3 >/dev/null 2>&1 ||
    { fail "psdata gen-video"; exit 1; }
M="--model tsm-r18 --width 16 --size 64 --frames 4 --flip 0 --dropout 0 --steps 3 --lr 0.02
   --momentum 0.9 --seed 5 --data-seed 9 --threads 1 --loader-threads 1 --no-plots
   --progress-every 0 --train-list $T/vid/train.txt --root $T/vid --loss-scale off"
two() { # two NAME [flags]: 2 ranks on cuda:0 over a TCP ring
    name=$1; shift
    peers=tcp://127.0.0.1:$(port 1),tcp://127.0.0.1:$(port 2)
    for r in 0 1; do
        timeout -k 2 120 "$PSW" $M --mode allreduce --peers "$peers" --rank $r --num-workers 2 \
            --batch 2 --device cuda:0 --bn sync --out "$T/$name" "$@" \
            >"$W/bnmem_$name$r.out" 2>&1 &
    done
    wait
}
timeout -k 2 120 "$PSW" $M --standalone --batch 4 --bn train --device cpu --out "$T/cpu" \
    >"$W/bnmem_cpu.out" 2>&1 || fail "the CPU reference run"
two sync32
out=$("$STC" "$T/sync32/model.safetensors" "$T/cpu/model.safetensors" --tol 2e-3 2>&1)
rc=$?
echo "--bn sync, 2 GPU workers fp32 vs 1 CPU process BN train: $out"
echo "RESULT bnmem sync_fp32 rc=$rc $out"
[ $rc -eq 0 ] || fail "--bn sync on the GPU (fp32) vs the CPU"
timeout -k 2 120 "$PSW" $M --standalone --batch 4 --bn train --device cuda:0 --precision fp16 \
    --out "$T/g16" >"$W/bnmem_g16.out" 2>&1 || fail "the GPU fp16 reference run"
two sync16 --precision fp16
out=$("$STC" "$T/sync16/model.safetensors" "$T/g16/model.safetensors" --tol 5e-2 2>&1)
rc=$?
echo "--bn sync, 2 GPU workers fp16 vs 1 GPU process fp16 BN train: $out"
echo "RESULT bnmem sync_fp16 rc=$rc $out"
[ $rc -eq 0 ] || fail "--bn sync on the GPU (fp16)"

# ---- 2. a detector's peak memory, ours and torchvision's -------------------------
model=fasterrcnn-r50 tv=fasterrcnn_resnet50_fpn masks=
if "$PSW" --help 2>&1 | grep -q 'maskrcnn-r'; then
    model=maskrcnn-r50 tv=maskrcnn_resnet50_fpn masks=--masks
fi
"$PSDATA" gen-det --out "$T/det" --images 8 --val-images 1 --size 800 --classes 3 --seed 2 $masks \
    >/dev/null 2>&1 || { fail "psdata gen-det"; exit $status; }
D="--model $model --size 800 --batch 2 --steps 3 --lr 0.001 --freeze-at 2 --threads 4
   --no-plots --progress-every 0 --train-json $T/det/annotations/instances_train.json
   --root $T/det/train --device cuda:0"
for v in "fp32:" "fp32:--recompute" "fp16:" "fp16:--recompute"; do
    p=${v%%:*} r=${v#*:} rf=0
    [ -n "$r" ] && rf=1
    name=det_${p}${r:+_recompute}
    timeout -k 2 150 "$PSW" $D --standalone --precision "$p" $r --out "$T/$name" \
        >"$W/bnmem_$name.out" 2>&1
    rc=$?
    mem=$(sed -n 's/^device_memory: peak_alloc_mib=\([0-9.]*\).*/\1/p' "$W/bnmem_$name.out")
    arena=$(grep '^final:' "$W/bnmem_$name.out" | tr ' ' '\n' | sed -n 's/^arena_peak_bytes=//p')
    if [ $rc -eq 0 ] && [ -n "$mem" ]; then
        echo "RESULT bnmem det impl=ours model=$model precision=$p recompute=$rf peak_alloc_mib=$mem arena_bytes=${arena:-?}"
    elif [ "$p" = fp16 ] && [ $rc -eq 2 ]; then
        echo "ours $model $p: refused (exit 2: $(grep -m1 'psworker:' "$W/bnmem_$name.out"))"
    else
        fail "ours $model $p $r (rc $rc)"
        tail -5 "$W/bnmem_$name.out"
    fi
done
PY=""
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PY=$p; break
    fi
done
if [ -n "$PY" ]; then
    timeout -k 2 200 "$PY" - "$tv" 2 800 3 >"$W/bnmem_torch.out" 2>&1 <<'PYEOF' || fail "torchvision's $tv memory"
import sys, torch, torchvision
name, n, size, K = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dev = torch.device("cuda")
for prec in ("fp32", "amp"):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    m = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None,
                                                     num_classes=K + 1, min_size=size,
                                                     max_size=size, trainable_backbone_layers=3)
    m = m.to(dev).train()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    s = float(size)
    box = torch.tensor([[0.1 * s, 0.1 * s, 0.5 * s, 0.45 * s], [0.4 * s, 0.3 * s, 0.9 * s, 0.95 * s]],
                       device=dev)
    tg = []
    for _ in range(n):
        t = {"boxes": box, "labels": torch.tensor([1, 2], device=dev)}
        if "mask" in name:
            mk = torch.zeros(2, size, size, dtype=torch.uint8, device=dev)
            for j, b in enumerate(box.int().tolist()):
                mk[j, b[1]:b[3], b[0]:b[2]] = 1
            t["masks"] = mk
        tg.append(t)
    imgs = [torch.rand(3, size, size, device=dev) for _ in range(n)]
    scaler = torch.cuda.amp.GradScaler(enabled=prec == "amp")
    for it in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=prec == "amp"):
            loss = sum(m(imgs, tg).values())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    print("RESULT bnmem det impl=torch model=%s precision=%s peak_alloc_mib=%.1f torch=%s"
          % (name, prec, torch.cuda.max_memory_allocated() / 2**20, torch.__version__))
    del m, opt
PYEOF
    cat "$W/bnmem_torch.out" | grep RESULT
else
    echo "PyTorch with CUDA not importable: torchvision's side skipped"
fi
exit $status
