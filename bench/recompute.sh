#!/bin/bash
# Benchmark: the memory and step-time cost of activation recomputation, one thread, one rank.
#
#   bench/recompute.sh [PIPELM]        (or PIPELM=... bench/recompute.sh)
#
# For the tutorial preset (B=8, T=128, one micro-batch) and GPT-2 124M at T=1024 (B=1), each of
# --recompute none, selective and full: the median step (pipelm bench), the peak RSS of the
# process, and the stage table's estimate of the activations one in-flight micro-batch holds.
# A report, not a test: it always exits 0. BENCH_STEPS (default 3), BENCH_WARMUP (1),
# BENCH_MODELS (default "tutorial gpt2").

PIPELM=${PIPELM:-${1:-./build/pipelm}}
STEPS=${BENCH_STEPS:-3}
WARMUP=${BENCH_WARMUP:-1}
MODELS=${BENCH_MODELS:-tutorial gpt2}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/recompute.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

json() { sed -n "s/.*\"$2\":\([-0-9.e]*\).*/\1/p" "$1" | head -n 1; }
echo "== activation recomputation, one thread; $(lscpu | sed -n 's/^Model name: *//p')"
printf "   %-9s %-10s %10s %12s %14s\n" model mode "step ms" "peak RSS MB" "act MB/mb est"
for model in $MODELS; do
    case $model in
        tutorial) args="--preset tutorial --batch 8 --seq-len 128" ;;
        gpt2) args="--preset gpt2 --batch 1 --seq-len 1024" ;;
        *) echo "   unknown model $model"; continue ;;
    esac
    for mode in none selective full; do
        f=$tmp/$model-$mode
        if ! timeout 1800 "$PIPELM" bench $args --microbatches 1 --threads 1 --steps "$STEPS" --warmup "$WARMUP" \
                --recompute $mode --json "$f.json" > "$f.log" 2>&1; then
            echo "   $model $mode failed: $(grep -m2 error "$f.log")"
            continue
        fi
        # the stage table's "act MB/mb" column (7th field of stage 0's row)
        est=$(awk '/^ +stage +rank +blocks +parts/ { getline; print $7; exit }' "$f.log")
        printf "   %-9s %-10s %10.1f %12.1f %14s\n" "$model" "$mode" "$(grep -o '"median":[0-9.]*' "$f.json" | cut -d: -f2)" \
            "$(json "$f.json" peak_rss_mb)" "$est"
    done
done
exit 0
