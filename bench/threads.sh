#!/bin/bash
# Benchmark: the training step on every thread layout, in one run (a report, not a test).
#
#   bench/threads.sh [PIPELM]       MODELS (default "tutorial gpt2"), STEPS (3), TORCH (1: also PyTorch)
#
# For the tutorial preset (B=8, T=128) and GPT-2 124M (B=4, T=256): the bare default command
# (no environment variables), 1 and 2 threads, 1 and 2 ranks x 1 thread with M micro-batches
# (8 for the tutorial, 4 for GPT-2, whose batch is 4), and
# Debian's PyTorch with 1 and 2 threads (OMP_WAIT_POLICY=PASSIVE, the same OpenBLAS kernel).
# Medians of STEPS timed steps after one warm-up. Targets (issue 14): default within 10% of
# the best pipelm setting, 2 threads >= 1.8x 1 thread, pipelm 2 threads >= 1.4x PyTorch 2 threads.
PIPELM=${PIPELM:-${1:-./build/pipelm}}
MODELS=${MODELS:-tutorial gpt2}
STEPS=${STEPS:-3}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/threads.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
clean() { env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE "$@"; }
median() { sed 's/.*"median":\([0-9.]*\).*/\1/' "$1"; }
# the kernel pipelm picks, for PyTorch (same library)
kernel=$(clean "$PIPELM" bench --peak 2>/dev/null | sed -n 's/.*OpenBLAS kernel \([A-Za-z0-9]*\).*/\1/p')
echo "pipelm $("$PIPELM" --version), OpenBLAS kernel $kernel, $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for model in $MODELS; do
    case $model in
    tutorial) args="--preset tutorial"; M=8; targs="--V 10000 --C 512 --L 8 --NH 8 --T 128 --B 8" ;;
    gpt2) args="--preset gpt2 --batch 4 --seq-len 256"; M=4; targs="--V 50257 --C 768 --L 12 --NH 12 --T 256 --maxT 1024 --B 4" ;;
    esac
    run() { # VAR NAME RANKS ENV... -- ARGS...: the median step into $VAR
        local var=$1 name=$2 np=$3; shift 3
        local envs=()
        while [ "$1" != -- ]; do envs+=("$1"); shift; done
        shift
        if [ "$np" = 1 ]; then clean "${envs[@]}" "$PIPELM" bench $args --warmup 1 --steps "$STEPS" --json "$tmp/j" "$@" > "$tmp/o" 2>&1
        else clean "${envs[@]}" mpiexec -n "$np" "$PIPELM" bench $args --warmup 1 --steps "$STEPS" --json "$tmp/j" "$@" > "$tmp/o" 2>&1; fi
        local m=0
        [ -s "$tmp/j" ] && m=$(median "$tmp/j")
        rm -f "$tmp/j"
        printf "  %-34s %10.1f ms\n" "$name" "$m"
        eval "$var=$m"
    }
    echo "$model:"
    run r1 "1 thread" 1 -- --threads 1
    run rdef "default (no settings)" 1 --
    run r2 "2 threads" 1 -- --threads 2
    run rm "1 rank x 1 thread (M=$M)" 1 -- --threads 1 --microbatches $M
    run rr "2 ranks x 1 thread (M=$M)" 2 -- --threads 1 --microbatches $M
    if [ "${TORCH:-1}" = 1 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
        t_1=0 t_2=0
        for t in 1 2; do
            clean OMP_WAIT_POLICY=PASSIVE OPENBLAS_CORETYPE="$kernel" /usr/bin/python3 "$here/torch_step.py" $targs \
                --threads $t --steps "$STEPS" --warmup 1 --json "$tmp/t.json" > "$tmp/to" 2>&1
            m=$(sed 's/.*"median_ms": *\([0-9.]*\).*/\1/' "$tmp/t.json" 2>/dev/null)
            printf "  %-34s %10.1f ms\n" "PyTorch $t thread(s)" "${m:-0}"
            eval "t_$t=${m:-0}"
        done
    fi
    awk -v d="$rdef" -v a="$r1" -v b="$r2" -v r="$rr" -v rm="$rm" -v M=$M -v t2="${t_2:-0}" 'BEGIN {
        best = a; if (b < best) best = b;
        printf "  default / best: %.3f of the best speed (target >= 0.90)\n", best / d;
        printf "  2 threads vs 1: %.2fx (target >= 1.8)\n", a / b;
        ideal = 2 * M / (M + 1);
        if (r > 0) printf "  2 ranks x 1 thread vs 1 rank x 1 thread, both M=%d: %.2fx throughput (ideal 2 M/(M+1) = %.2f: %.2f of ideal; target >= 0.9)\n", M, rm / r, ideal, rm / r / ideal;
        if (t2 > 0) printf "  pipelm 2 threads vs PyTorch 2 threads: %.2fx (target >= 1.4)\n", t2 / b }'
done
exit 0
