#!/bin/bash
# Benchmark (issue 38): a Mixtral step against the dense Llama with the same active
# parameters, one thread, one rank, fp32 (--backend cpu).
#
#   bench/moe_step.sh [PIPELM]        (or PIPELM=... bench/moe_step.sh)
#
# The tutorial's size: V 10000, C 512, L 8, NH 8, T 128, B 8 (one micro-batch). MoE: 8 experts
# of hidden 1024, top-2 (--moe-ffn-dim 1024); dense: a SwiGLU MLP of hidden 2048 = 2 x 1024
# (--ffn-dim-multiplier 1.5 --multiple-of 256), so both multiply each token by the same
# weights' count. The two are run alternately BENCH_ROUNDS times (default 3) and each one's
# median step (`pipelm bench`, BENCH_STEPS timed after BENCH_WARMUP) is reported with the
# ratio MoE / dense (target: <= 1.3, routing, permutation and the per-expert products costing
# at most 30 %) and the machine's load (`uptime`): other processes on the cores move both.
# Then BENCH_BALANCE_STEPS (default 200; 0: skip) steps of mixtral-tiny with the sigmoid-bias
# router print the max / mean tokens per expert every 20 steps (target: <= 1.2 at the end).
# A report, not a test: it always exits 0.
PIPELM=${PIPELM:-${1:-./build/pipelm}}
PY=/usr/bin/python3
STEPS=${BENCH_STEPS:-5}
WARMUP=${BENCH_WARMUP:-2}
ROUNDS=${BENCH_ROUNDS:-3}
BAL=${BENCH_BALANCE_STEPS:-200}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moe_step.XXXXXX") || exit 0
trap 'rm -rf "$tmp"' EXIT
COMMON="--preset tutorial --batch 8 --seq-len 128 --microbatches 1 --threads 1 --backend cpu --steps $STEPS --warmup $WARMUP"
DENSE="--arch llama --ffn-dim-multiplier 1.5 --multiple-of 256"
MOE="--arch mixtral --n-experts 8 --experts-per-token 2 --moe-ffn-dim 1024"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(uptime | sed 's/.*load/load/')"
med() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['step_ms']['median'])" "$1"; }
d_all=""; m_all=""
for r in $(seq "$ROUNDS"); do
    for kind in dense moe; do
        opts=$DENSE; [ $kind = moe ] && opts=$MOE
        if timeout 1800 "$PIPELM" bench $COMMON $opts --json "$tmp/$kind$r.json" > "$tmp/$kind$r.log" 2>&1; then
            ms=$(med "$tmp/$kind$r.json")
            printf 'round %d  %-6s median step %9.1f ms\n' "$r" "$kind" "$ms"
            if [ $kind = dense ]; then d_all="$d_all $ms"; else m_all="$m_all $ms"; fi
        else
            echo "round $r $kind failed: $(tail -n 2 "$tmp/$kind$r.log" | tr '\n' ' ')"
        fi
    done
done
grep -m1 "^model" "$tmp/dense1.log"; grep -m1 "^model" "$tmp/moe1.log"
"$PY" - "$d_all" "$m_all" <<'PYEOF'
import statistics, sys
d = [float(x) for x in sys.argv[1].split()]
m = [float(x) for x in sys.argv[2].split()]
if d and m:
    print("dense median of rounds %.1f ms, MoE %.1f ms: MoE / dense = %.3f (target <= 1.3)"
          % (statistics.median(d), statistics.median(m), statistics.median(m) / statistics.median(d)))
PYEOF
echo "load after: $(uptime | sed 's/.*load/load/')"
if [ "$BAL" -gt 0 ]; then
    echo "sigmoid-bias router, mixtral-tiny, $BAL steps (markov data): max / mean tokens per expert"
    "$PIPELM" train --preset mixtral-tiny --router sigmoid-bias --router-bias-rate 0.001 --steps "$BAL" --threads 1 \
        --eval-every 0 --progress 0 --log-every 20 --metrics "$tmp/bal.jsonl" > "$tmp/bal.log" 2>&1 \
        || echo "balance run failed: $(tail -n 2 "$tmp/bal.log")"
    "$PY" - "$tmp/bal.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"moe"' in l]
for r in rows:
    if r["step"] == 1 or r["step"] % 20 == 0:
        print("  step %4d  load max/mean %.3f  aux %.4f" % (r["step"], r["load_max_mean"], r["aux_loss"]))
PYEOF
fi
exit 0
