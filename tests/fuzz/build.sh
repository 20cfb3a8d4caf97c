#!/bin/sh
# Build the libFuzzer harnesses in tests/fuzz/ (not part of the normal build
# or of `make check`; tests/test_fuzz_replay replays the seed corpus there).
#
# Needs clang 14 with its runtime libraries (libFuzzer, ASan, UBSan) and the
# project's -dev packages.  On Debian 12:
#   apt-get install clang-14 libclang-rt-14-dev \
#       liblz4-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libcjson-dev
#
# Usage: tests/fuzz/build.sh [OUTDIR] [--run SECONDS]
#   OUTDIR defaults to ./fuzz-build.  With --run, each fuzzer then runs for
#   SECONDS on a scratch copy of its seed corpus (new inputs land there, the
#   committed corpus is not touched), and the script fails if any fuzzer
#   found a crash (crash-* files are left in OUTDIR).
# Run one by hand:
#   OUTDIR/fuzz_codec -max_total_time=600 -close_fd_mask=2 CORPUSDIR tests/fuzz/corpus/codec
# Targets: codec (every dtype x codec x decode mode), wire (ps_wire_recv over
# an inproc ZeroMQ pipe), safetensors (ps_st_parse + accessors), config
# (INI file and argv), video_list (the TSM dataset list reader of
# worker/data, linked with libjpeg: apt-get install libjpeg62-turbo-dev),
# coco (the COCO annotation / results readers of worker/det, segmentations
# and masks, and the evaluation of what they accept).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=${1:-fuzz-build}
case "$out" in --run) out=fuzz-build ;; *) [ $# -gt 0 ] && shift ;; esac
run=0
if [ "${1:-}" = "--run" ]; then run=${2:?--run needs SECONDS}; fi

CC=${CC:-clang-14}
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "build.sh: $CC not found; install clang-14 and libclang-rt-14-dev (see the top of this script)" >&2
    exit 1
fi
mkdir -p "$out/proto" "$out/obj"
out=$(cd "$out" && pwd)

# the wire header is generated code, as in the normal build
protoc-c --proto_path="$top/proto" --c_out="$out/proto" "$top/proto/ps.proto"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CFLAGS="-std=gnu11 -g -O1 -D_GNU_SOURCE -I$top -I$top/common -I$out -I$out/proto $SAN"
LIBS="-llz4 -lzmq -lprotobuf-c -lcjson -lm"

# every common/ source goes into an archive, so the linker takes what the
# harnesses need and a new helper file there needs no edit here
rm -f "$out/obj"/*.o "$out/libfz_common.a"
for src in "$top"/common/*.c "$out/proto/ps.pb-c.c"; do
    $CC $CFLAGS -fsanitize=fuzzer-no-link -c "$src" -o "$out/obj/$(basename "$src" .c).o"
done
ar rcs "$out/libfz_common.a" "$out/obj"/*.o
objs="$out/libfz_common.a"
# the dataset list reader and what it calls (JPEG probe / decode)
mkdir -p "$out/objdata"
rm -f "$out/objdata"/*.o "$out/libfz_data.a"
for src in "$top"/worker/data/video_list.c "$top"/worker/data/ps_image.c; do
    $CC $CFLAGS -fsanitize=fuzzer-no-link -c "$src" -o "$out/objdata/$(basename "$src" .c).o"
done
ar rcs "$out/libfz_data.a" "$out/objdata"/*.o
# the COCO readers, masks and evaluation
mkdir -p "$out/objdet"
rm -f "$out/objdet"/*.o "$out/libfz_det.a"
for src in "$top"/worker/det/coco_*.c; do
    $CC $CFLAGS -fsanitize=fuzzer-no-link -c "$src" -o "$out/objdet/$(basename "$src" .c).o"
done
ar rcs "$out/libfz_det.a" "$out/objdet"/*.o

targets="codec wire safetensors config video_list coco"
for t in $targets; do
    extra=
    [ "$t" = video_list ] && extra="$out/libfz_data.a -ljpeg"
    [ "$t" = coco ] && extra="$out/libfz_det.a"
    $CC $CFLAGS -fsanitize=fuzzer "$here/fuzz_$t.c" $extra $objs $LIBS -o "$out/fuzz_$t"
    echo "built $out/fuzz_$t"
done

[ "$run" -gt 0 ] 2>/dev/null || exit 0
status=0
for t in $targets; do
    work="$out/corpus-$t"
    mkdir -p "$work"
    echo "running fuzz_$t for ${run}s"
    (cd "$out" && ./fuzz_$t -max_total_time="$run" -close_fd_mask=3 -print_final_stats=1 \
        "$work" "$here/corpus/$t") || status=1
done
ls "$out"/crash-* "$out"/leak-* "$out"/timeout-* 2>/dev/null && status=1
exit $status
