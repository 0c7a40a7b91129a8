#!/bin/bash
# Benchmark: the training step with the OpenBLAS kernel pipelm picks by default against
# every kernel this CPU can run, in one run (a report, not a test: it always exits 0).
#
#   bench/blas_kernel.sh [PIPELM]     PRESET (default tutorial), STEPS (5), THREADS (1)
#
# Prints the median step (pipelm bench, after 2 warm-up steps) per kernel and the default's
# ratio to the best one; the target is default >= 0.95 x best.
PIPELM=${PIPELM:-${1:-./build/pipelm}}
PRESET=${PRESET:-tutorial}
STEPS=${STEPS:-5}
export OMP_NUM_THREADS=${THREADS:-1} OPENBLAS_NUM_THREADS=${THREADS:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/blas_kernel.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
flags=$(grep -m1 '^flags' /proc/cpuinfo)
kernels="Prescott Haswell"
case "$flags" in *avx512bw*) kernels="$kernels SkylakeX" ;; esac
case "$flags" in *avx512_bf16*) kernels="$kernels Cooperlake" ;; esac
step() { # ENV...: median step ms of `pipelm bench`
    env "$@" "$PIPELM" bench --preset "$PRESET" --warmup 2 --steps "$STEPS" --json "$tmp/b.json" > "$tmp/b.out" 2>&1
    sed 's/.*"median":\([0-9.]*\).*/\1/' "$tmp/b.json"
}
def=$(step -u OPENBLAS_CORETYPE)
kdef=$(grep -o '"blas_kernel":"[^"]*"' "$tmp/b.json" | cut -d'"' -f4)
printf "preset %s, %s thread(s), median of %s steps\n" "$PRESET" "$OMP_NUM_THREADS" "$STEPS"
printf "  %-22s %10.1f ms\n" "default ($kdef)" "$def"
best=$def bestk=default
for k in $kernels; do
    t=$(step OPENBLAS_CORETYPE=$k)
    printf "  %-22s %10.1f ms\n" "$k" "$t"
    if awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t bestk=$k; fi
done
awk -v d="$def" -v b="$best" -v k="$bestk" \
    'BEGIN { printf "default / best (%s): %.3f of the best speed (target >= 0.95)\n", k, b / d }'
exit 0
