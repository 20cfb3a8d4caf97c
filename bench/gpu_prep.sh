#!/bin/sh
# Prepare a GPU session on THIS machine (no GPU needed): build the GPU test
# programs for sm_90 and put them, with the host libraries a bare GPU
# machine may lack, into one folder that travels with the tree.
#
# Why: the lent GPU machines run an image with nvcc 13, cuDNN/cuBLAS (as
# PyTorch's pip packages) and PyTorch, but without this project's other
# build dependencies (libzmq, libuv, protobuf-c, OpenBLAS, cJSON, autotools),
# so `configure` cannot run there and every minute of the lease would go to
# a build that fails.  The device programs need none of them except
# OpenBLAS (the CPU reference side) and cJSON; those are copied here.
#
#   bench/gpu_prep.sh [BUILD_DIR]     (default /tmp/ps-gpu-prep)
# Output: tests/test_cuda_carry/ (ignored by git: /tests/test_* in
# .gitignore) holding test_cuda_cast, test_cuda_layers, test_cuda_det, test_cuda_rcnn, test_cuda_half,
# test_cuda_half_model, test_cuda_table, test_cuda_layers3d, gpu_bench, psd, psworker, psdata (bench/gpu_train.sh),
# test_nccl (when NCCL was found) and lib/ (libopenblas, libgfortran,
# libquadmath, libgomp, libcjson, libcudart, and libzmq, libuv, libjpeg,
# liblz4, protobuf-c with what they link); ~55 MB, under the device
# tool's 64 MiB carry limit.  Then, in the device call:
#   carry: ["tests/test_cuda_carry"]
#   command: bench/gpu_check.sh
# gpu_check.sh uses the carried programs when it finds them and builds
# nothing (cuDNN and cuBLAS come from the machine: its CUDA toolkit or
# PyTorch's nvidia-* packages).
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-/tmp/ps-gpu-prep}
OUT=$SRC/tests/test_cuda_carry
J=${PS_PREP_JOBS:-2}

mkdir -p "$B"
cd "$B"
if [ ! -f Makefile ]; then
    "$SRC/configure" -q NVCC_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"
fi
grep -q '^NVCC = .*nvcc' Makefile || { echo "gpu_prep: configure did not find CUDA here" >&2; exit 1; }
make -s proto/ps.pb-c.h >/dev/null
make -s -j"$J" tests/test_cuda_cast tests/test_cuda_layers tests/test_cuda_det tests/test_cuda_half \
    tests/test_cuda_half_model tests/test_cuda_table tests/test_cuda_rcnn tests/test_cuda_layers3d \
    bench/gpu_bench psd psworker psdata
nccl=
if grep -q '^#define PS_HAVE_NCCL 1' config.h && make -s -j"$J" tests/test_nccl; then
    nccl=tests/test_nccl
fi

rm -rf "$OUT"
mkdir -p "$OUT/lib"
for b in tests/test_cuda_cast tests/test_cuda_layers tests/test_cuda_det tests/test_cuda_half \
    tests/test_cuda_half_model tests/test_cuda_table tests/test_cuda_rcnn tests/test_cuda_layers3d \
    bench/gpu_bench psd psworker psdata $nccl; do
    cp "$b" "$OUT/"
done
# host libraries the programs need that a bare image may lack (not the
# CUDA libraries: the device's own driver-matched cuDNN / cuBLAS are used)
for b in "$OUT"/test_* "$OUT"/gpu_bench "$OUT"/psd "$OUT"/psworker "$OUT"/psdata; do
    ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    # test_nccl and psd / psworker (bench/gpu_train.sh) talk ZeroMQ: libzmq and
    # what it links; psworker / psd also read JPEG, LZ4 and protobuf-c
    libopenblas*|libgfortran*|libquadmath*|libgomp*|libcjson*|libcudart*|libzmq*|libsodium*|\
    libpgm*|libnorm*|libbsd*|libmd.so*|libgssapi_krb5*|libkrb5*|libk5crypto*|libcom_err*|\
    libkeyutils*|libjpeg*|liblz4*|libprotobuf-c*|libuv*)
        cp -L "$lib" "$OUT/lib/" ;;
    esac
done
printf 'built %s on %s from %s\n' "$(date -u +%FT%TZ)" "$(hostname)" \
    "$(cd "$SRC" && git rev-parse --short HEAD 2>/dev/null || echo '?')" >"$OUT/BUILD_INFO"
( cd "$SRC" && git status --short 2>/dev/null | head -50 ) >>"$OUT/BUILD_INFO"
du -sh "$OUT"
ls -la "$OUT" "$OUT/lib"
