#!/bin/bash
# Benchmark: two builds' training steps side by side, interleaved (a report, not a test).
#
#   bench/ab_step.sh PIPELM_A PIPELM_B      ROUNDS (3), STEPS (3), CONFIGS (below)
#
# Each round runs every configuration with A then B (B then A on odd rounds, so a drift of the
# machine's speed falls on both), one thread a rank, and keeps `pipelm bench`'s median step;
# the report gives each build's median over the rounds and B/A. For a change that should not
# move performance (a refactor), B/A within the spread of the rounds is "unchanged".
A=${1:?usage: bench/ab_step.sh PIPELM_A PIPELM_B}
B=${2:?usage: bench/ab_step.sh PIPELM_A PIPELM_B}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3}
CONFIGS=${CONFIGS:-"1|--preset tutorial --backend cpu
1|--preset tutorial --backend onednn --precision bf16
1|--preset llama-tiny --batch 8 --seq-len 128 --backend cpu
2|--preset tutorial --backend cpu --stages 2 --microbatches 8"}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ab.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
step() { # NP BIN ARGS...: the median step in ms, or 0
    local np=$1 bin=$2; shift 2
    rm -f "$tmp/j"
    env OMP_NUM_THREADS=1 mpiexec -n "$np" "$bin" bench --threads 1 --warmup 1 --steps "$STEPS" --json "$tmp/j" "$@" \
        > "$tmp/o" 2>&1
    if [ -s "$tmp/j" ]; then sed 's/.*"median":\([0-9.]*\).*/\1/' "$tmp/j"; else echo 0; fi
}
med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print NR ? v[int((NR+1)/2)] : 0}'; }
echo "A: $A ($("$A" --version 2>&1 | head -n 1))"
echo "B: $B ($("$B" --version 2>&1 | head -n 1))"
echo "$(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); load $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
while IFS= read -r cfg; do
    [ -n "$cfg" ] || continue
    np=${cfg%%|*}; args=${cfg#*|}; ta=; tb=
    for r in $(seq 1 "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then ta="$ta $(step "$np" "$A" $args)"; tb="$tb $(step "$np" "$B" $args)"
        else tb="$tb $(step "$np" "$B" $args)"; ta="$ta $(step "$np" "$A" $args)"; fi
    done
    ma=$(echo "$ta" | med); mb=$(echo "$tb" | med)
    printf "%d rank(s) %-58s A %8.1f ms  B %8.1f ms  B/A %.3f   (A:%s; B:%s)\n" "$np" "$args" "$ma" "$mb" \
        "$(awk -v a="$ma" -v b="$mb" 'BEGIN {print (a > 0 ? b / a : 0)}')" "$ta" "$tb"
    i=$((i + 1))
done <<< "$CONFIGS"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
