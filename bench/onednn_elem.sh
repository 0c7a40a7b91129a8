#!/bin/bash
# Benchmark: the memory-bound ops of a bf16 step (LayerNorm, residual, GELU, embedding, loss,
# AdamW, the gradient norm's sum of squares) alone through the oneDNN backend, one thread: ms a
# call, GB/s of the bytes each must read and write, and that against a copy of the same size
# class (the first copy line) measured in the same process. Where the ops run near the copy's
# GB/s, the op classes are at this machine's memory speed and only moving fewer bytes (fusing
# passes) makes them faster; far below it, the loop itself is slow.
#
#   bench/onednn_elem.sh [BUILDDIR]      (default ./build; needs a build with oneDNN)
#
# BENCH_ELEM_SHAPE ("1024 512 10000 30462976": the tutorial's N = B T, C, V and parameters;
# GPT-2 124M at B 4, T 256: "1024 768 50304 124475904"), BENCH_REPS (20). Times are the best
# call by the thread's CPU time, for a machine other jobs load. A report, not a test.
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
BUILD=$(cd "${1:-$TOP/build}" && pwd) || exit 2
[ -f "$BUILD/libpipelm.a" ] || { echo "no $BUILD/libpipelm.a: build first" >&2; exit 2; }
grep -q '^#define HAVE_ONEDNN 1' "$BUILD/config.h" || { echo "$BUILD was configured without oneDNN" >&2; exit 2; }
var() { sed -n "s/^$1 = //p" "$BUILD/Makefile"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/onednn_elem.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -fopenmp -I"$TOP/include" $(var BLAS_CFLAGS) -o "$tmp/onednn_elem" "$HERE/onednn_elem.c" \
    "$BUILD/libpipelm.a" $(var HDF5_LIBS) $(var INIH_LIBS) $(var ISAL_LIBS) $(var BLAS_LIBS) $(var DNNL_LIBS) -lm || exit 2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "== memory-bound ops alone, 1 thread, $(uptime | sed 's/.*load/load/'), $(lscpu | sed -n 's/^Model name: *//p')"
"$tmp/onednn_elem" ${BENCH_ELEM_SHAPE:-1024 512 10000 30462976} "${BENCH_REPS:-20}"
exit 0
