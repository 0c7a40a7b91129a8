#!/bin/bash
# Benchmark: data parallelism, one thread per rank (issue 25's target: --dp 2 on two ranks
# >= 1.85x one rank on the tutorial preset, batch 8, M=2; --zero 1 at least as fast as --zero 0).
#
#   bench/dp.sh [PIPELM]        (or PIPELM=... bench/dp.sh)
#
# BENCH_ROUNDS rounds (default 3), each running, one after the other (so that a change of the
# machine's load hits every configuration alike):
#   one      1 rank, batch 8, M micro-batches
#   dp2-old  --dp 2 as before the overlap work: one MPI test per block (PIPELM_DP_POLL=0) and
#            every gather waited for before the update (PIPELM_DP_DEFER=0)
#   dp2      --dp 2 as built (8 MPI tests after every backend op, gathers hidden behind AdamW)
#   z1-old   --dp 2 --zero 1, old way
#   z1       --dp 2 --zero 1, as built
# and prints, per round, each configuration's tokens/s over one rank's (same round), then the
# medians over rounds; per --dp run: the reduction not hidden (dp_wait_ms), the gradient MB
# still reducing when the backward ended (dp_pending_mb: the tied wte and block 0 are the
# floor, they are final only at the end), the optimizer's part (optim ms, the AdamW op class)
# and ZeRO's parameter all-gather ms. Then GPT-2 124M, --dp 2 with and without --zero 1, one
# step: AdamW state per rank. `uptime`'s load average is printed beside every round: figures
# from a loaded machine are not trustworthy. A report, not a test: it always exits 0.
# BENCH_STEPS (default 4), BENCH_WARMUP (1), BENCH_M (2), BENCH_GPT2=0 skips GPT-2.

PIPELM=${PIPELM:-${1:-./build/pipelm}}
STEPS=${BENCH_STEPS:-4}
WARMUP=${BENCH_WARMUP:-1}
ROUNDS=${BENCH_ROUNDS:-3}
M=${BENCH_M:-2}
MPIEXEC=${MPIEXEC:-mpiexec}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dp_bench.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# json FILE KEY: the first numeric value of KEY
json() { sed -n "s/.*\"$2\":\([-0-9.e]*\).*/\1/p" "$1" | head -n 1; }
# opclass LOG NAME: the ms per step of one op class in rank 0's table
opclass() { sed -n "s/^  $2  *\([0-9.]*\) .*/\1/p" "$1" | head -n 1; }
# run TAG NP ARGS...: pipelm bench into TAG.json / TAG.log
run() {
    local tag=$1 np=$2
    shift 2
    timeout 1800 "$MPIEXEC" -n "$np" "$PIPELM" bench --threads 1 --json "$tmp/$tag.json" "$@" > "$tmp/$tag.log" 2>&1 \
        || { echo "   $tag failed: $(grep -m2 error "$tmp/$tag.log")"; rm -f "$tmp/$tag.json"; return 1; }
}
# median of the numbers on stdin
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR) printf "%.4g\n", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

echo "== data parallelism, one thread per rank; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) CPUs"
T="--preset tutorial --batch 8 --seq-len 128 --steps $STEPS --warmup $WARMUP --microbatches $M"
CONFIGS="one dp2-old dp2 z1-old z1"
for round in $(seq 1 "$ROUNDS"); do
    load=$(uptime | sed 's/.*load average: //')
    run "one.$round" 1 $T
    PIPELM_DP_POLL=0 PIPELM_DP_DEFER=0 run "dp2-old.$round" 2 $T --dp 2
    run "dp2.$round" 2 $T --dp 2
    PIPELM_DP_POLL=0 PIPELM_DP_DEFER=0 run "z1-old.$round" 2 $T --dp 2 --zero 1
    run "z1.$round" 2 $T --dp 2 --zero 1
    [ -f "$tmp/one.$round.json" ] || continue
    a=$(json "$tmp/one.$round.json" tokens_per_s)
    line="   round $round (load $load): 1 rank $(printf %.0f "$a") tok/s;"
    for c in $CONFIGS; do
        [ "$c" = one ] || [ ! -f "$tmp/$c.$round.json" ] && continue
        b=$(json "$tmp/$c.$round.json" tokens_per_s)
        r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
        echo "$r" >> "$tmp/ratio.$c"
        line="$line $c $r x"
    done
    echo "$line"
    for c in $CONFIGS; do
        f="$tmp/$c.$round.json"
        [ -f "$f" ] || continue
        json "$f" median >> "$tmp/step.$c"
        [ "$c" = one ] && { opclass "$tmp/$c.$round.log" optimizer >> "$tmp/adamw.$c"; json "$f" optimizer_ms >> "$tmp/opt.$c"; continue; }
        json "$f" dp_wait_ms >> "$tmp/wait.$c"
        json "$f" dp_pending_mb >> "$tmp/pend.$c"
        json "$f" optimizer_ms >> "$tmp/opt.$c"
        json "$f" zero_gather_ms >> "$tmp/gath.$c"
        opclass "$tmp/$c.$round.log" optimizer >> "$tmp/adamw.$c"
    done
done
echo "   medians over $ROUNDS rounds (target: dp2 and z1 >= 1.85 x, z1 >= dp2):"
printf "   %-8s %9s %9s %12s %13s %9s %9s %12s\n" config "x 1 rank" "step ms" "dp-wait ms" "pending MB" "optim ms" "AdamW ms" "ZeRO gather"
for c in $CONFIGS; do
    [ -f "$tmp/step.$c" ] || continue
    m() { [ -f "$tmp/$1.$c" ] && median < "$tmp/$1.$c" || echo -; }
    printf "   %-8s %9s %9s %12s %13s %9s %9s %12s\n" "$c" "$(m ratio)" "$(m step)" "$(m wait)" "$(m pend)" "$(m opt)" \
        "$(m adamw)" "$(m gath)"
done
echo "   (optim ms: the step's end on rank 0, the unhidden reduction included; AdamW ms: the optimizer op class)"
if [ "${BENCH_GPT2:-1}" != 0 ]; then
    G="--preset gpt2 --batch 2 --seq-len 64 --steps 1 --warmup 0 --microbatches 1 --dp 2"
    run g0 2 $G
    run g1 2 $G --zero 1
    [ -f "$tmp/g0.json" ] && [ -f "$tmp/g1.json" ] && \
        echo "   GPT-2 124M, D=2: AdamW m+v per rank unsharded $(json "$tmp/g0.json" optimizer_state_mb) MB, ZeRO-1 $(json "$tmp/g1.json" optimizer_state_mb) MB; peak RSS $(json "$tmp/g0.json" peak_rss_mb) / $(json "$tmp/g1.json" peak_rss_mb) MB"
fi
exit 0
