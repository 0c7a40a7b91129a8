#!/bin/bash
# Benchmark: context parallelism (issue 40's targets: --cp 2 on two ranks >= 1.6x one rank at
# T = 4096; T = 16384 trains with --cp 2 on one 24 GB machine, GPT-2 124M shapes, B = 1).
#
#   bench/cp.sh [PIPELM]        (or PIPELM=... bench/cp.sh)
#
# 1. T = 4096, B = 1, GPT-2 124M's widths (C 768, 12 heads, vocabulary 50257) with
#    BENCH_LAYERS blocks (default 2: a step of all 12 takes minutes on two cores), one thread
#    per rank: one rank, then --cp 2 on two ranks with the ring and with the all-gather, each
#    BENCH_STEPS timed steps (default 2) after one warm-up; prints the step medians, the
#    speed-ups over one rank and the peak RSS of each rank (CP rank 0's row).
# 2. T = 16384, B = 1, all 12 blocks, --cp 2 (ring), --recompute BENCH_RECOMPUTE (default full:
#    without it the two ranks' activations do not fit 24 GB beside the AdamW state), one
#    step without warm-up: the step time, CP rank 0's peak RSS and the machine's used memory,
#    sampled every 5 s (the other rank's RSS is of the same size). BENCH_16K=0 skips it.
# `uptime`'s load average is printed beside every run: figures from a loaded machine are not
# trustworthy. A report, not a test: it always exits 0.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
STEPS=${BENCH_STEPS:-2}
LAYERS=${BENCH_LAYERS:-2}
MPIEXEC=${MPIEXEC:-mpiexec}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cp_bench.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT

# json FILE KEY: the first numeric value of KEY
json() { sed -n "s/.*\"$2\":\([-0-9.e]*\).*/\1/p" "$1" | head -n 1; }
# run TAG NP ARGS...: pipelm bench into TAG.json / TAG.log, the load average before it
run() {
    local tag=$1 np=$2
    shift 2
    echo "   $tag: load $(uptime | sed 's/.*load average: //') before"
    timeout 3000 "$MPIEXEC" -n "$np" "$PIPELM" bench --json "$tmp/$tag.json" "$@" > "$tmp/$tag.log" 2>&1 \
        || { echo "   $tag failed: $(grep -m2 error "$tmp/$tag.log")"; rm -f "$tmp/$tag.json"; return 1; }
}

echo "== context parallelism; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) CPUs, $(free -g | awk '/Mem:/{print $2}') GB"
G="--preset gpt2 --max-seq-len 16384 --batch 1 --microbatches 1 --progress 0"
A="$G --n-layer $LAYERS --seq-len 4096 --steps $STEPS --warmup 1 --threads 1"
run one 1 $A
run ring 2 $A --cp 2
run allgather 2 $A --cp 2 --cp-comm allgather
if [ -f "$tmp/one.json" ]; then
    a=$(json "$tmp/one.json" median)
    echo "   T=4096, $LAYERS blocks: one rank $a ms a step (peak RSS $(json "$tmp/one.json" peak_rss_mb) MB)"
    for c in ring allgather; do
        [ -f "$tmp/$c.json" ] || continue
        b=$(json "$tmp/$c.json" median)
        echo "   --cp 2 $c: $b ms a step, $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }') x one rank;" \
            "CP rank 0 peak RSS $(json "$tmp/$c.json" peak_rss_mb) MB, CP attention $(json "$tmp/$c.json" cp_attention_ms)" \
            "ms a step, of it $(json "$tmp/$c.json" cp_exchange_ms) ms waiting in the exchanges"
    done
fi

if [ "${BENCH_16K:-1}" != 0 ]; then
    rc=${BENCH_RECOMPUTE:-full}
    ( while sleep 5; do free -m | awk '/Mem:/{print $3}'; done > "$tmp/used.txt" ) &
    mon=$!
    if run t16k 2 $G --seq-len 16384 --steps 1 --warmup 0 --cp 2 --recompute "$rc"; then
        echo "   T=16384, 12 blocks, --cp 2, --recompute $rc: $(json "$tmp/t16k.json" median) ms a step," \
            "CP rank 0 peak RSS $(json "$tmp/t16k.json" peak_rss_mb) MB, machine's used memory at most" \
            "$(sort -n "$tmp/used.txt" | tail -n 1) MB, final loss $(sed -n 's/.*final loss \([0-9.]*\).*/\1/p' "$tmp/t16k.log")"
    fi
    kill "$mon" 2>/dev/null
fi
echo "   load after: $(uptime | sed 's/.*load average: //')"
exit 0
