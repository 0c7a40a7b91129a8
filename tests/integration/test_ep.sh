#!/bin/bash
# test_ep.sh — expert parallelism (--ep E, issue 38; parallel/ep.h): each of E data-parallel
# replicas computes n-experts / E experts of every MoE layer for its group. With --grad-accum
# exact a run is bit-identical across E = 1, 2, 4 at D = 4 (and with pipeline stages, zb-h1,
# ZeRO-1, dualpipev); within 1e-5 without; a checkpoint saved at E = 2 resumes at E = 4 and at
# E = 1 on two stages with the same bits; E not dividing D (or the experts), --ep on a dense
# model and with --tp refused by name; an EP rank whose experts get no token; a rank killed
# inside an all-to-all ends the job in seconds, named. Tiny runs (2 steps); every mpiexec under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
need_torch # PY; torch for section 4c's model writer (the weights' comparison needs the standard library only)
cd "$WORK"
COMMON="--preset mixtral-tiny --n-experts 4 --steps 2 --batch 16 --seq-len 16 --eval-every 0 --progress 0 --log-every 100"
EX="--grad-accum exact"

# 1. bit-identical across E at D = 4 (exact), the stage table naming the experts per rank
for E in 1 2 4; do
    CK=""
    [ $E = 2 ] && CK="--ckpt-dir ck --ckpt-every 1" # the checkpoint of section 4
    mpirun_t 120 4 train $COMMON $EX --dp 4 --microbatches 2 --ep $E $CK --metrics e$E.jsonl --save-final e$E.bin \
        > e$E.out 2>&1 || bad "exact E=$E" "$(tail -n 2 e$E.out | tr '\n' ' ')"
done
[ "$(losses e1.jsonl | wc -l)" -eq 2 ] && ok "reference: D = 4, --ep 1, exact" || bad "reference run" "$(tail -n 2 e1.out)"
for E in 2 4; do
    if cmp -s e1.bin e$E.bin && [ "$(losses e1.jsonl)" = "$(losses e$E.jsonl)" ] \
            && grep -q "expert parallel: E=$E replicas share each stage's experts" e$E.out; then
        ok "--grad-accum exact: E = $E at D = 4 bit-identical to E = 1 (losses, final weights)"
    else bad "exact E=$E" "$(tail -n 2 e$E.out | tr '\n' ' ')"; fi
done
grep -q "^      0        3     3    2-3  " e2.out && grep -q "^      0        3     3    3-3  " e4.out \
    && ok "the grid lists each rank's experts (replica 3: experts 2-3 at E = 2, 3 at E = 4)" \
    || bad "experts column" "$(grep -A5 'stage  replica' e2.out | tr '\n' '|')"

# 2. stages, schedules, ZeRO-1: D x P = 2 x 2 with E = 2 gives the same bits
same_as_e1() { # NAME ARGS...
    local f=$1
    shift
    if mpirun_t 120 4 train $COMMON $EX "$@" --metrics "$f.jsonl" --save-final "$f.bin" > "$f.out" 2>&1 \
            && cmp -s e1.bin "$f.bin" && [ "$(losses e1.jsonl)" = "$(losses "$f.jsonl")" ]; then
        ok "$f: bit-identical to D = 4, E = 1"
    else bad "$f" "$(tail -n 2 "$f.out" | tr '\n' ' ')"; fi
}
same_as_e1 P2_E2_zb-h1_zero1 --dp 2 --ep 2 --stages 2 --microbatches 4 --schedule zb-h1 --zero 1
if full_tier; then same_as_e1 P2_E2_dualpipev --dp 2 --ep 2 --stages 2 --microbatches 4 --schedule dualpipev
else full_only "dualpipev at D x P = 2 x 2, E = 2"; fi

# 3. without exact sums: E = 2 within 1e-5 of E = 1 (D = 2; D = 4 in the full tier)
ND=2
full_tier && ND=4
mpirun_t 120 $ND train $COMMON --dp $ND --microbatches 2 --metrics n1.jsonl --save-final n1.bin > n1.out 2>&1
mpirun_t 120 $ND train $COMMON --dp $ND --microbatches 2 --ep 2 --metrics n2.jsonl --save-final n2.bin > n2.out 2>&1
if "$PY" - n1.bin n2.bin n1.jsonl n2.jsonl > close.out 2>&1 <<'PYEOF'
import sys, json, array
a, b = (array.array('f', open(f, 'rb').read()[2048:]) for f in sys.argv[1:3])
assert len(a) == len(b) and len(a) > 0
scale = max(abs(x) for x in a)
d = max(abs(x - y) for x, y in zip(a, b))
la, lb = ([json.loads(l)['loss'] for l in open(f) if '"event":"step"' in l] for f in sys.argv[3:5])
dl = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
print(f"weights: max diff {d:.3g} of max {scale:.3g}; losses: max rel diff {dl:.3g}")
sys.exit(0 if d <= 1e-5 * scale and dl <= 1e-5 and len(la) == 2 else 1)
PYEOF
then ok "no exact sums: E = 2 within 1e-5 of E = 1 at D = $ND ($(cat close.out))"
else bad "E=2 within 1e-5" "$(tail -n 3 close.out n2.out | tr '\n' ' ')"; fi

# 4. checkpoints by global expert id: saved at E = 2 (section 1), resumed at E = 1 on 2 stages and at E = 4
resume() { # FILE NAME ARGS...
    local f=$1 name=$2
    shift 2
    if mpirun_t 120 4 train $COMMON $EX --resume ck/ckpt_00000001.h5 "$@" --metrics "$f.jsonl" --save-final "$f.bin" \
            > "$f.out" 2>&1 && cmp -s e1.bin "$f.bin" && [ "$(losses e1.jsonl | tail -n 1)" = "$(losses "$f.jsonl")" ]; then
        ok "checkpoint of E = 2 resumed $name: final weights and loss bit-identical"
    else bad "resume $name" "$(tail -n 2 "$f.out" | tr '\n' ' ')"; fi
}
if full_tier; then resume r_E4 "at E = 4" --dp 4 --microbatches 2 --ep 4; else full_only "resume at E = 4"; fi
resume r_E1_P2 "at E = 1 on 2 stages" --dp 2 --stages 2 --microbatches 4 --ep 1

# 4b. bf16 (oneDNN), exact sums: D = 2 with E = 2 gives one process's bits (full tier; a CPU
# without native bf16 skips it)
if full_tier; then
    BFC="--preset mixtral-tiny --n-experts 4 --steps 3 --batch 8 --seq-len 16 --eval-every 0 --progress 0 --backend onednn --precision bf16 $EX"
    mpirun_t 120 1 train $BFC --microbatches 4 --save-final bf1.bin > bf1.out 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q "no native bf16\|bf16 support" bf1.out; then echo "skip - bf16 EP: no native bf16 here"
    elif [ $rc -eq 0 ] && mpirun_t 120 2 train $BFC --dp 2 --ep 2 --microbatches 2 --save-final bf2.bin > bf2.out 2>&1 \
            && cmp -s bf1.bin bf2.bin; then ok "bf16 (oneDNN), exact: D = 2, E = 2 bit-identical to one process"
    else bad "bf16 EP" "rc $rc $(tail -n 2 bf1.out bf2.out | tr '\n' ' ')"; fi
else full_only "bf16 (oneDNN) with --ep 2"; fi

# 4c. an EP rank whose experts receive no token: a sigmoid-bias model (tests/reference/
# torch_moe.py's writer) whose bias of 10 on experts 0 and 1 sends every token there, so at
# E = 2 rank 1's experts get nothing; exact sums at D = 2 give E = 1's bits
if [ $TORCH = 1 ]; then
    "$PY" - "$SRC/tests/reference" skew.bin > skew.out 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import torch_moe as tm
cfg = tm.Config(V=256, C=48, L=2, NH=6, NKV=2, maxT=32, E=4, K=2, F=24, router=1, rate=0.0)
p = tm.random_model(cfg, 3)
b = p[tm.names(cfg).index("bias")]
b[:, 0] = b[:, 1] = 10.0
tm.write_model(sys.argv[2], cfg, p)
PYEOF
    SK="--init skew.bin --steps 2 --batch 8 --seq-len 16 --eval-every 0 --progress 0 --log-every 100 $EX --dp 2 --microbatches 2"
    for E in 1 2; do
        mpirun_t 120 2 train $SK --ep $E --metrics k$E.jsonl --save-final k$E.bin > k$E.out 2>&1 || bad "skewed E=$E" "$(tail -n 2 k$E.out | tr '\n' ' ')"
    done
    if cmp -s k1.bin k2.bin && [ "$(losses k1.jsonl)" = "$(losses k2.jsonl)" ] && grep -q '"load_max_mean":2,' k2.jsonl; then
        ok "every token on experts 0 and 1 (rank 1's experts idle at E = 2): E = 2 bit-identical to E = 1"
    else bad "skewed routing" "$(cat skew.out | tail -n 2) $(tail -n 2 k2.out | tr '\n' ' ')"; fi
fi

# 5. refusals, by name
refused() { # NAME PATTERN RANKS ARGS...
    local name=$1 pat=$2 r=$3
    shift 3
    mpirun_t 60 "$r" "$@" > bad.out 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pat" bad.out; then ok "refused: $name"
    else bad "refused: $name" "rc=$rc $(tail -n 2 bad.out | tr '\n' ' ')"; fi
}
refused "E not dividing D" "--ep 3: it must divide --dp" 4 train $COMMON --dp 4 --ep 3
refused "E not dividing the experts" "--ep 2: it must divide --n-experts" 2 train $COMMON --dp 2 --ep 2 --n-experts 5
refused "--ep on a dense model" "--ep 2: expert parallelism needs a mixture-of-experts model" 2 train --preset llama-tiny \
    --steps 1 --batch 4 --seq-len 16 --dp 2 --ep 2
if full_tier; then refused "--ep with --tp" "does not split the experts" 4 train $COMMON --dp 2 --tp 2 --ep 2
else full_only "--ep with --tp refused"; fi

# 6. a rank killed (SIGKILL) inside an EP all-to-all: mpiexec ends the job within seconds; the
# rank's note before its death names it and the exchange (as test_tp.sh's tp-kill)
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --dp 4 --ep 2 --fail-rank 2 --fail-step 2 --fail-at ep-kill --watchdog 20 > kill.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 30 ] \
    && grep -q "rank 2: note: --fail-at ep-kill: killing this rank (SIGKILL) inside the EP all-to-all of the forward's dispatch, step 2" kill.out \
    && grep -q "BAD TERMINATION" kill.out \
    && ok "a rank killed inside an EP all-to-all: the job ends in ${secs} s (rc $rc), the rank and the exchange named" \
    || bad "EP kill" "rc $rc after ${secs} s: $(tail -n 4 kill.out | tr '\n' ' ')"

# 7. bench: the all-to-all time, its exposed part and the load balance
if mpirun_t 120 2 bench $COMMON --batch 8 --dp 2 --ep 2 --microbatches 2 --steps 3 --warmup 1 --json b.json > b.out 2>&1 \
        && grep -q '"ep":2' b.json && grep -q '"ep_alltoall_ms":' b.json && grep -q '"ep_alltoall_exposed_ms":' b.json \
        && grep -q '"moe_load_max_mean":' b.json && grep -q '"moe_dropped":' b.json \
        && grep -q "stage 0: EP all-to-all .* ms per step (E=2), exposed .*tokens per expert max/mean" b.out; then
    ok "bench: the EP all-to-all ms, its exposed part and the load balance (text and JSON)"
else bad "bench EP" "$(tail -n 3 b.out | tr '\n' ' ')"; fi
finish
