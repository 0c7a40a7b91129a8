#!/bin/bash
# Benchmark: matmul GFLOP/s per shape through the backends' matmul ops, one thread by default:
# backend_cpu (OpenBLAS sgemm), backend_onednn fp32 and bf16 (bf16 includes converting both
# inputs on every call; the share that conversion takes is printed, with the same conversion
# through a oneDNN reorder for comparison).
#
#   bench/onednn_matmul.sh [BUILDDIR]        (default ./build; needs a build --with-onednn)
#
# bwd_weight bf16 is also timed with wgrad-layout=1 and =0 interleaved (the blocked activation
# layout against plain rows). Shapes: N = 1024 rows; the tutorial model's C x OC (512x1536 qkv, 512x2048 fc, 2048x512 proj,
# 512x512 attproj, 512x10000 lm head) and GPT-2 124M's (768x2304, 768x768, 768x3072, 3072x768, 768x50304). BENCH_THREADS (1),
# BENCH_SECONDS (0.5 per op and backend), BENCH_N (1024), BENCH_SHAPES override; BENCH_CPU_TIME=1
# times by the process's CPU time instead of the wall clock (a loaded machine, one thread). A report, not a
# test: exits 0 unless the driver cannot be built.
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
BUILD=$(cd "${1:-$TOP/build}" && pwd) || exit 2
[ -f "$BUILD/libpipelm.a" ] || { echo "no $BUILD/libpipelm.a: build first" >&2; exit 2; }
grep -q '^#define HAVE_ONEDNN 1' "$BUILD/config.h" || { echo "$BUILD was configured without oneDNN" >&2; exit 2; }
var() { sed -n "s/^$1 = //p" "$BUILD/Makefile"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/onednn_matmul.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -fopenmp -I"$TOP/include" $(var BLAS_CFLAGS) -o "$tmp/onednn_matmul" "$HERE/onednn_matmul.c" \
    "$BUILD/libpipelm.a" $(var HDF5_LIBS) $(var INIH_LIBS) $(var ISAL_LIBS) $(var BLAS_LIBS) $(var DNNL_LIBS) -lm || exit 2
T=${BENCH_THREADS:-1}
export OMP_NUM_THREADS=$T OPENBLAS_NUM_THREADS=$T
# the driver does not run pipelm's OpenBLAS kernel choice (src/backend/cpu/blas.c): pick the same family here
if [ -z "$OPENBLAS_CORETYPE" ]; then
    if grep -q -m1 -w avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake
    elif grep -q -m1 -w avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
fi
echo "== matmul GFLOP/s, $T thread(s), ${BENCH_CPU_TIME:+CPU time, }$(uptime | sed 's/.*load/load/'), $(lscpu | sed -n 's/^Model name: *//p'); bf16 ISA: $(grep -o -m1 -w 'amx_bf16\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$tmp/onednn_matmul" "${BENCH_N:-1024}" "$T" "${BENCH_SECONDS:-0.5}" \
    ${BENCH_SHAPES:-512x1536 512x512 512x2048 2048x512 512x10000 768x2304 768x768 768x3072 3072x768 768x50304}
exit 0
