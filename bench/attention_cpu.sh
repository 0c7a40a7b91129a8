#!/bin/bash
# Benchmark: the CPU backend's causal attention, forward + backward per layer, with
# --backend-opt attention=full (the (T, T) probabilities kept for the backward) and
# attention=tiled (the fused path: the output and the row log-sum-exp), the speed-up and the
# megabytes each keeps per layer and micro-batch.
#
#   bench/attention_cpu.sh [BUILDDIR]        (default ./build)
#
# GPT-2 124M's attention by default: B = 4 sequences, 12 heads of 64 (BENCH_B, BENCH_NH,
# BENCH_NKV, BENCH_HS), T = 64 128 256 512 1024 (BENCH_T), one thread (BENCH_THREADS),
# BENCH_SECONDS (1) of repetitions per mode and T; BENCH_BACKEND=onednn (BENCH_PRECISION=bf16)
# measures the oneDNN backend's two paths instead. A report, not a test: exits 0 unless the
# driver cannot be built.
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
BUILD=$(cd "${1:-$TOP/build}" && pwd) || exit 2
[ -f "$BUILD/libpipelm.a" ] || { echo "no $BUILD/libpipelm.a: build first" >&2; exit 2; }
var() { sed -n "s/^$1 = //p" "$BUILD/Makefile"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attention_cpu.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -fopenmp -I"$TOP/include" $(var BLAS_CFLAGS) -o "$tmp/attention_cpu" "$HERE/attention_cpu.c" \
    "$BUILD/libpipelm.a" $(var HDF5_LIBS) $(var INIH_LIBS) $(var ISAL_LIBS) $(var BLAS_LIBS) $(var DNNL_LIBS) -lm || exit 2
T=${BENCH_THREADS:-1}
export OMP_NUM_THREADS=$T OPENBLAS_NUM_THREADS=$T
# the driver does not run pipelm's OpenBLAS kernel choice (src/backend/cpu/blas.c): pick the same family here
if [ -z "$OPENBLAS_CORETYPE" ]; then
    if grep -q -m1 -w avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake
    elif grep -q -m1 -w avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
fi
B=${BENCH_B:-4} NH=${BENCH_NH:-12} NKV=${BENCH_NKV:-${BENCH_NH:-12}} HS=${BENCH_HS:-64}
echo "== attention fwd+bwd per layer (CPU ms), B=$B NH=$NH NKV=$NKV HS=$HS, $T thread(s), $(lscpu | sed -n 's/^Model name: *//p'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$tmp/attention_cpu" "$B" "$NH" "$NKV" "$HS" "$T" "${BENCH_SECONDS:-1}" ${BENCH_T:-64 128 256 512 1024}
exit 0
