#!/bin/bash
# ckpt_bandwidth.sh — checkpoint save/load bandwidth against plain POSIX writes of the same bytes.
#
#   bench/ckpt_bandwidth.sh [PRESET [RANKS...]]     (default: tutorial 2 4; presets tiny|tutorial|gpt2)
#
# For each rank count P: the test driver (tests/unit/test_ckpt bench, built by `make check`) saves
# the preset's full state (parameters + both AdamW moments, split evenly over P stages) with
# ckpt_save and loads it back with ckpt_load (REPS times; each save without pruning: keep 0,
# the driver removes the previous file untimed); then bench/posix_write.c (compiled here with
# mpicc) writes each rank's same share of bytes with pwrite() into one file and rank 0 fsyncs
# it, as ckpt_save does. Prints both MB/s and the ratio (target: save >= 80% of POSIX) for the
# best run of each, and the ratio of the median runs (this file system's fsync time varies).
# The load follows its save, so it mostly reads the page cache.
# Environment: BUILD (build dir, default ../build from this script), BENCH_DIR (scratch dir on
# the file system to measure, default a fresh directory under $TMPDIR), REPS (default 3),
# MPIEXEC (default mpiexec), PIPELM_CKPT_XFER (independent, the default, or collective: how
# ckpt_save transfers the data; passed through to the ranks).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-$HERE/../build}
MPIEXEC=${MPIEXEC:-mpiexec}
REPS=${REPS:-3}
PRESET=${1:-tutorial}
shift || true
RANKS=${*:-2 4}
DRIVER=$BUILD/tests/unit/test_ckpt
if [ ! -x "$DRIVER" ]; then
    echo "ckpt_bandwidth: $DRIVER not built (run: make -C $BUILD tests/unit/test_ckpt)" >&2
    exit 2
fi
DIR=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ckpt_bench.XXXXXX")}
mkdir -p "$DIR"
[ -z "${BENCH_DIR:-}" ] && trap 'rm -rf "$DIR"' EXIT
mpicc -O2 -o "$DIR/posix_write" "$HERE/posix_write.c" || exit 2
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

echo "checkpoint bandwidth, preset $PRESET, ${PIPELM_CKPT_XFER:-independent} transfers, file system of $DIR ($(df -h "$DIR" | awk 'NR==2{print $1}'))"
printf "%5s %10s %10s %10s %11s %7s %11s %11s %7s\n" ranks "MB" "save MB/s" "load MB/s" "POSIX MB/s" "ratio" \
    "save (med)" "POSIX (med)" "ratio"
status=0
for P in $RANKS; do
    out=$(timeout 1800 "$MPIEXEC" -n "$P" "$DRIVER" bench "$DIR/ck" "$PRESET" "$REPS" 2>&1)
    line=$(echo "$out" | grep '^ckpt ')
    share=$(echo "$out" | sed -n 's/^rank_bytes=//p')
    if [ -z "$line" ] || [ -z "$share" ]; then
        echo "ckpt_bandwidth: the checkpoint run on $P ranks failed:" >&2
        echo "$out" | tail -n 5 >&2
        status=1
        continue
    fi
    rm -rf "$DIR/ck"
    val() { echo "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
    bytes=$(val "$line" bytes)
    save=$(val "$line" save_MBps)
    savem=$(val "$line" save_median_MBps)
    load=$(val "$line" load_MBps)
    pline=$(timeout 1800 "$MPIEXEC" -n "$P" "$DIR/posix_write" "$DIR/posix.bin" "$share" "$REPS" 2>&1 | grep '^posix ')
    posix=$(val "$pline" MBps)
    posixm=$(val "$pline" median_MBps)
    if [ -z "$posix" ]; then
        echo "ckpt_bandwidth: the POSIX run on $P ranks failed" >&2
        status=1
        continue
    fi
    ratio=$(awk -v a="$save" -v b="$posix" 'BEGIN { printf "%.0f%%", 100 * a / b }')
    ratiom=$(awk -v a="$savem" -v b="$posixm" 'BEGIN { printf "%.0f%%", 100 * a / b }')
    printf "%5d %10.1f %10s %10s %11s %7s %11s %11s %7s\n" "$P" "$(awk -v b="$bytes" 'BEGIN{print b/1e6}')" "$save" \
        "$load" "$posix" "$ratio" "$savem" "$posixm" "$ratiom"
done
exit $status
