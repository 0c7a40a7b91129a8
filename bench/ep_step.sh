#!/bin/bash
# Benchmark (issue 38): expert parallelism, --ep 2 on two ranks against one rank on the same
# global batch, one thread a rank, fp32 (--backend cpu).
#
#   bench/ep_step.sh [PIPELM]        (or PIPELM=... bench/ep_step.sh)
#
# The tutorial's Mixtral: V 10000, C 512, L 8, NH 8, T 128, 8 experts of hidden 1024, top-2,
# global batch BENCH_BATCH (default 8) in one micro-batch a replica. Three layouts, run
# alternately BENCH_ROUNDS times (default 3): one rank; D = 2 replicas with --ep 2 (each rank
# computes 4 of the 8 experts for both); D = 2 with --ep 1 (each rank its own tokens' experts),
# each one's median step (`pipelm bench`, BENCH_STEPS timed after BENCH_WARMUP) and the
# speed-up over one rank (target for --ep 2: >= 1.7), with the EP all-to-all's ms per step and
# the tokens per expert max / mean bench reports, and the machine's load (`uptime`): other
# processes on the cores move every figure. A report, not a test: it always exits 0.
PIPELM=${PIPELM:-${1:-./build/pipelm}}
PY=/usr/bin/python3
MPIEXEC=${MPIEXEC:-mpiexec}
STEPS=${BENCH_STEPS:-3}
WARMUP=${BENCH_WARMUP:-1}
ROUNDS=${BENCH_ROUNDS:-3}
B=${BENCH_BATCH:-8}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ep_step.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
COMMON="--preset tutorial --arch mixtral --n-experts 8 --experts-per-token 2 --moe-ffn-dim 1024 --batch $B
 --seq-len 128 --microbatches 1 --threads 1 --backend cpu --steps $STEPS --warmup $WARMUP"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load: $(uptime | sed 's/.*load/load/')"
declare -A ALL
for r in $(seq "$ROUNDS"); do
    for kind in one ep2 dp2; do
        case $kind in
            one) np=1; opts="" ;;
            ep2) np=2; opts="--dp 2 --ep 2" ;;
            dp2) np=2; opts="--dp 2 --ep 1" ;;
        esac
        if timeout 1800 "$MPIEXEC" -n $np "$PIPELM" bench $COMMON $opts --json "$tmp/$kind$r.json" > "$tmp/$kind$r.log" 2>&1; then
            line=$("$PY" -c "
import json,sys; d=json.load(open(sys.argv[1])); s=d['stages'][0]
print('%.1f %.1f %.3f' % (d['step_ms']['median'], s.get('ep_alltoall_ms', 0), s.get('moe_load_max_mean', 0)))" "$tmp/$kind$r.json")
            set -- $line
            printf 'round %d  %-4s (%d rank%s)  median step %9.1f ms  EP all-to-all %7.1f ms/step  load max/mean %s  (%s)\n' \
                "$r" "$kind" $np "$([ $np -gt 1 ] && echo s)" "$1" "$2" "$3" "$(uptime | sed 's/.*load/load/')"
            ALL[$kind]="${ALL[$kind]} $1"
        else
            echo "round $r $kind failed: $(tail -n 2 "$tmp/$kind$r.log" | tr '\n' ' ')"
        fi
    done
done
"$PY" - "${ALL[one]}" "${ALL[ep2]}" "${ALL[dp2]}" <<'PYEOF'
import statistics, sys
one, ep2, dp2 = ([float(x) for x in a.split()] for a in sys.argv[1:4])
if one and ep2:
    o = statistics.median(one)
    print("medians of rounds: one rank %.1f ms, --ep 2 on 2 ranks %.1f ms: speed-up %.2fx (target >= 1.7)"
          % (o, statistics.median(ep2), o / statistics.median(ep2)))
    if dp2:
        print("  --ep 1 on 2 ranks (each replica its own experts) %.1f ms: %.2fx" % (statistics.median(dp2),
              o / statistics.median(dp2)))
PYEOF
echo "load after: $(uptime | sed 's/.*load/load/')"
exit 0
