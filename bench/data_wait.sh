#!/bin/bash
# Benchmark (issue 39): the data loader's share of a training step on the tutorial preset
# with shuffled shards (target <= 1 %).
#
#   bench/data_wait.sh [PIPELM]        (or PIPELM=... bench/data_wait.sh)
#
# Writes BENCH_SHARDS (default 4) uint16 shards of 500,000 random tokens (V 10000), trains the
# tutorial preset on them (`--data 'DIR/tut_*.bin'`, shuffled per epoch) for BENCH_STEPS steps
# (default 13) with `--timers-every 6`, once with the batches prefetched one step ahead (the
# default) and once read when needed (the test hook PIPELM_PREFETCH=0), and prints the timers'
# "step" and "data wait" lines and the share of the last full window, with `uptime`: other
# processes on the cores move the step. A report, not a test: it always exits 0.
PIPELM=${PIPELM:-${1:-./build/pipelm}}
PY=/usr/bin/python3
STEPS=${BENCH_STEPS:-13}
NSH=${BENCH_SHARDS:-4}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/data_wait.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$tmp" "$NSH" << 'PYEOF'
import random, struct, sys
random.seed(1)
for i in range(int(sys.argv[2])):
    n = 500000
    with open("%s/tut_%d.bin" % (sys.argv[1], i), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack("<%dH" % n, *[random.randrange(10000) for _ in range(n)]))
PYEOF
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(uptime | sed 's/.*load/load/')"
for pf in 1 0; do
    PIPELM_PREFETCH=$pf timeout 1800 mpiexec -n 1 "$PIPELM" train --preset tutorial --data "$tmp/tut_*.bin" \
        --steps "$STEPS" --timers-every 6 --eval-every 0 --progress 0 --log-every 1000 > "$tmp/p$pf.out" 2>&1
    echo "prefetch $pf: $(grep -m1 '^data:' "$tmp/p$pf.out")"
    grep -E "timers over|  step  |data wait" "$tmp/p$pf.out" | sed 's/^/  /'
    awk '/timers over/ { w = $0 } /  step  / { s = $3 } /data wait/ { d = $4; if (w !~ /-'"$STEPS"' /) { S = s; D = d } }
         END { if (S > 0) printf "  data wait / step (steps 7-12): %.4f ms / %.1f ms = %.5f %%\n", D, S, 100 * D / S }' "$tmp/p$pf.out"
done
echo "load after: $(uptime | sed 's/.*load/load/')"
exit 0
