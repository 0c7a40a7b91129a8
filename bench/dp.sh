#!/bin/bash
# Benchmark: data parallelism, one thread per rank.
#
#   bench/dp.sh [PIPELM]        (or PIPELM=... bench/dp.sh)
#
# In one run, on the tutorial preset (global batch 8 x 128, one micro-batch per replica):
#   1 rank against --dp 2 (2 replicas x 1 stage): throughput ratio (target >= 1.85), and per
#   stage the reduction time the backward did not hide (dp_wait_ms);
#   --dp 2 --stages 1 with and without --zero 1: AdamW state (m and v) per rank;
# then GPT-2 124M, --dp 2 with and without --zero 1, one timed step: AdamW state per rank.
# Ranks beyond the cores are oversubscribed (say so when reporting). A report, not a test:
# it always exits 0. BENCH_STEPS (default 6), BENCH_WARMUP (2), BENCH_GPT2=0 skips GPT-2.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
STEPS=${BENCH_STEPS:-6}
WARMUP=${BENCH_WARMUP:-2}
MPIEXEC=${MPIEXEC:-mpiexec}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp_bench.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# json FILE KEY: the first numeric value of KEY
json() { sed -n "s/.*\"$2\":\([-0-9.e]*\).*/\1/p" "$1" | head -n 1; }
# run TAG NP ARGS...: pipelm bench into TAG.json
run() {
    local tag=$1 np=$2
    shift 2
    timeout 1800 "$MPIEXEC" -n "$np" "$PIPELM" bench --threads 1 --json "$tmp/$tag.json" "$@" > "$tmp/$tag.log" 2>&1 \
        || { echo "   $tag failed: $(grep -m2 error "$tmp/$tag.log")"; return 1; }
}

echo "== data parallelism, one thread per rank; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) CPUs"
T="--preset tutorial --batch 8 --seq-len 128 --steps $STEPS --warmup $WARMUP"
run one 1 $T --microbatches 1
run dp2 2 $T --microbatches 1 --dp 2
run dp2z 2 $T --microbatches 1 --dp 2 --zero 1
if [ -f "$tmp/one.json" ] && [ -f "$tmp/dp2.json" ]; then
    a=$(json "$tmp/one.json" tokens_per_s)
    b=$(json "$tmp/dp2.json" tokens_per_s)
    c=$(json "$tmp/dp2z.json" tokens_per_s)
    awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
        printf "   tutorial: 1 rank %.0f tok/s; 2 replicas x 1 stage %.0f tok/s = %.3f x (target >= 1.85); with ZeRO-1 %.0f tok/s = %.3f x\n",
               a, b, b / a, c, c / a }'
    echo "   step ms (median): 1 rank $(grep -o '"median":[0-9.]*' "$tmp/one.json" | cut -d: -f2), --dp 2 $(grep -o '"median":[0-9.]*' "$tmp/dp2.json" | cut -d: -f2), --dp 2 --zero 1 $(grep -o '"median":[0-9.]*' "$tmp/dp2z.json" | cut -d: -f2)"
    echo "   reduction not hidden (dp_wait_ms per step, stage 0): $(json "$tmp/dp2.json" dp_wait_ms) ms; with ZeRO-1 $(json "$tmp/dp2z.json" dp_wait_ms) ms"
    echo "   AdamW m+v per rank: unsharded $(json "$tmp/dp2.json" optimizer_state_mb) MB, ZeRO-1 $(json "$tmp/dp2z.json" optimizer_state_mb) MB"
fi
if [ "${BENCH_GPT2:-1}" != 0 ]; then
    G="--preset gpt2 --batch 2 --seq-len 64 --steps 1 --warmup 0 --microbatches 1 --dp 2"
    run g0 2 $G
    run g1 2 $G --zero 1
    [ -f "$tmp/g0.json" ] && [ -f "$tmp/g1.json" ] && \
        echo "   GPT-2 124M, D=2: AdamW m+v per rank unsharded $(json "$tmp/g0.json" optimizer_state_mb) MB, ZeRO-1 $(json "$tmp/g1.json" optimizer_state_mb) MB; peak RSS $(json "$tmp/g0.json" peak_rss_mb) / $(json "$tmp/g1.json" peak_rss_mb) MB"
fi
exit 0
