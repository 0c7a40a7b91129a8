#!/bin/bash
# tests/long/bf16_tutorial.sh — `make check-long`: the tutorial preset trained for 200 steps
# in fp32 (cpu backend) and in bf16 (onednn backend), side by side, one thread each; the
# bf16 loss after 200 steps must be within 2% of the fp32 one. About 20 minutes on two
# cores, so it is not part of `make check`.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
STEPS=${STEPS:-200}
COMMON="--preset tutorial --steps $STEPS --microbatches 1 --threads 1 --progress 0 --log-every 50 --eval-every 0"
timeout -k 5 3600 "$MPIEXEC" -n 1 "$PIPELM" train $COMMON --backend cpu --metrics fp32.jsonl > fp32.out 2>&1 &
p1=$!
timeout -k 5 3600 "$MPIEXEC" -n 1 "$PIPELM" train $COMMON --backend onednn --precision bf16 --metrics bf16.jsonl > bf16.out 2>&1
r2=$?
wait $p1
r1=$?
[ $r1 = 0 ] && [ $r2 = 0 ] || bad "runs" "fp32 rc $r1, bf16 rc $r2: $(tail -n 2 fp32.out bf16.out | tr '\n' ' ')"
a=$(losses fp32.jsonl | tail -n 1)
b=$(losses bf16.jsonl | tail -n 1)
if python3 -c "import sys; a, b = float('$a'), float('$b'); print('fp32 %.4f bf16 %.4f: %.2f%%' % (a, b, 100 * abs(b - a) / a)); sys.exit(0 if abs(b - a) <= 0.02 * a else 1)"; then
    ok "tutorial after $STEPS steps: bf16 loss $b within 2% of fp32's $a"
else
    bad "tutorial bf16 vs fp32" "fp32 $a, bf16 $b"
fi
finish
