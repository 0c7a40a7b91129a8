#!/bin/bash
# test_moe.sh — Mixtral (--arch mixtral, issue 38's sparse mixture-of-experts) end to end: the
# independent torch reference (tests/reference/torch_moe.py: E = 5 top-2 with the aux loss; a
# shared expert with the sigmoid-bias router; every token on one expert; capacity drops; the
# model read from Hugging Face Mixtral files; 5 AdamW steps, every gradient, the aux loss and
# the drops reported, the balancing bias); the Hugging Face round trip byte-exact; mixtral-tiny bit-identical across stage
# counts, schedules (1f1b, zb-h1, zb-v, dualpipev, interleaved chunks), recomputation and,
# with --grad-accum exact, data-parallel replicas; a checkpoint saved on 2 ranks resumed on 3;
# generate the same tokens on 1, 2 and 3 ranks; bf16 (oneDNN) learning, the same bits on 1 and 2
# stages; the refusals named. Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
need_torch
cd "$WORK"
STEPS=4
COMMON="--preset mixtral-tiny --steps $STEPS --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0 --log-every 100"

# 1. the independent reference
if [ $TORCH = 1 ]; then
    if OMP_NUM_THREADS=1 timeout -k 5 400 "$PY" "$SRC/tests/reference/torch_moe.py" --pipelm "$PIPELM" --timeout 120 \
            > torch.out 2>&1; then
        ok "torch reference: $(grep -c '^PASS: [a-z-]* (' torch.out) cases ($(grep '^PASS: [a-z-]* (' torch.out | cut -d' ' -f2 | tr -d ':' | tr '\n' ' '))"
    else bad "torch reference" "$(grep -B2 -A8 "^FAIL" torch.out | tr "\n" " " | cut -c1-800) $(tail -n 3 torch.out | tr "\n" " ")"; fi
fi

# 2. the same bits across stage counts, schedules, chunks and recomputation (the sigmoid-bias
# router with a shared expert, so the bias's sign step and its gradient slot cross stages too)
VAR="--shared-experts 1 --router sigmoid-bias --router-bias-rate 0.01"
mpirun_t 120 1 train $COMMON $VAR --metrics ref.jsonl --save-final ref.bin > ref.out 2>&1 || bad reference "exit $?"
[ "$(losses ref.jsonl | wc -l)" -eq $STEPS ] && grep -q "model: mixtral" ref.out && ok "mixtral-tiny reference run" \
    || bad "reference run" "$(tail -n 3 ref.out | tr '\n' ' ')"
same() { cmp -s ref.bin "$1.bin" && [ "$(losses ref.jsonl)" = "$(losses "$1.jsonl")" ]; }
run_same() { # run_same NAME RANKS ARGS...
    local f=$1 p=$2
    shift 2
    if mpirun_t 120 "$p" train $COMMON $VAR "$@" --metrics "$f.jsonl" --save-final "$f.bin" > "$f.out" 2>&1 && same "$f"; then
        ok "$f: losses and final weights bit-identical to one process"
    else bad "$f" "$(tail -n 2 "$f.out" | tr '\n' ' ')"; fi
}
run_same P2_1f1b 2 --schedule 1f1b
run_same P3_zb-h1 3 --schedule zb-h1
run_same P2_zb-v 2 --schedule zb-v
run_same P2_dualpipev 2 --schedule dualpipev
run_same P2_interleaved 2 --schedule interleaved-1f1b --chunks-per-rank 2
run_same P2_full 2 --recompute full --schedule zb-h1
run_same P1_selective 1 --recompute selective
# replicas: with --grad-accum exact D = 2 gives one process's bits (the load errors summed too);
# the same micro-batches (the aux loss is a micro-batch's): 4 of 2 sequences, 2 per replica
mpirun_t 120 1 train $COMMON $VAR --grad-accum exact --metrics ex1.jsonl --save-final ex1.bin > ex1.out 2>&1
if mpirun_t 120 2 train $COMMON $VAR --grad-accum exact --dp 2 --microbatches 2 --metrics ex2.jsonl --save-final ex2.bin > ex2.out 2>&1 \
        && cmp -s ex1.bin ex2.bin && [ "$(losses ex1.jsonl)" = "$(losses ex2.jsonl)" ]; then
    ok "--grad-accum exact: D = 2 bit-identical to one process"
else bad "exact D=2" "$(tail -n 2 ex2.out | tr '\n' ' ')"; fi
if mpirun_t 120 4 train $COMMON $VAR --grad-accum exact --dp 2 --stages 2 --zero 1 --schedule zb-h1 --microbatches 2 \
        --metrics ex4.jsonl --save-final ex4.bin > ex4.out 2>&1 && cmp -s ex1.bin ex4.bin \
        && [ "$(losses ex1.jsonl)" = "$(losses ex4.jsonl)" ]; then
    ok "--grad-accum exact: D x P = 2 x 2, ZeRO-1 (the bias's sign step on its shard), zb-h1 bit-identical to one process"
else bad "exact D=2 P=2 ZeRO-1" "$(tail -n 2 ex4.out | tr '\n' ' ')"; fi

# 3. a checkpoint saved on 2 ranks, resumed on 3, continues bit-identically
mpirun_t 120 2 train $COMMON $VAR --ckpt-dir ck --ckpt-every 2 --metrics a.jsonl > a.out 2>&1 || bad "save on 2" "$(tail -n 2 a.out)"
if mpirun_t 120 3 train $COMMON $VAR --resume ck/ckpt_00000002.h5 --metrics b.jsonl --save-final b.bin > b.out 2>&1 \
        && cmp -s ref.bin b.bin && [ "$(losses ref.jsonl | tail -n 2)" = "$(losses b.jsonl)" ]; then
    ok "checkpoint of 2 ranks resumed on 3: final weights (the balancing bias included) and losses bit-identical"
else bad "resume 2 -> 3" "$(tail -n 2 b.out | tr '\n' ' ')"; fi
"$PIPELM" inspect ck/ckpt_00000004.h5 > insp.out 2>&1
if [ $? -eq 0 ] && grep -q 'arch  *"mixtral"' insp.out && grep -q "n_experts  *5" insp.out \
        && grep -q "/model/h.3/experts_w2  *(360, 48)" insp.out && grep -q "/model/h.0/router_bias" insp.out; then
    ok "inspect: the Mixtral /config attributes and the stacked experts, every checksum OK"
else bad "inspect" "$(tail -n 3 insp.out | tr '\n' ' ')"; fi
if "$PIPELM" convert ref.bin ref.h5 > cv1.out 2>&1 && "$PIPELM" convert ref.h5 back.bin > cv2.out 2>&1 && cmp -s ref.bin back.bin; then
    ok "convert: Mixtral model file -> checkpoint -> model file is byte-identical"
else bad "convert round trip" "$(cat cv1.out cv2.out | tail -n 2 | tr '\n' ' ')"; fi

# Hugging Face's Mixtral layout (one tensor per expert): a softmax model through it and back
# byte-identical in f32; the variants it cannot hold refused by name
mpirun_t 120 1 train $COMMON --save-final sm.bin > sm.out 2>&1 || bad "softmax run" "$(tail -n 2 sm.out)"
if "$PIPELM" convert --to hf sm.bin hfd > hf1.out 2>&1 && "$PIPELM" convert hfd hfd.h5 > hf2.out 2>&1 \
        && "$PIPELM" convert hfd.h5 smb.bin > hf3.out 2>&1 && cmp -s sm.bin smb.bin \
        && grep -q '"num_local_experts": 5' hfd/config.json; then
    ok "Hugging Face Mixtral round trip (model file -> HF -> checkpoint -> model file) byte-identical in f32"
else bad "HF round trip" "$(cat hf1.out hf2.out hf3.out | tail -n 2 | tr '\n' ' ')"; fi
if ! "$PIPELM" convert --to hf ref.bin hfs > hfs.out 2>&1 && grep -q "cannot hold this model: shared experts" hfs.out; then
    ok "refused: shared experts into Hugging Face's Mixtral"
else bad "refused: shared experts to HF" "$(tail -n 2 hfs.out | tr '\n' ' ')"; fi

# 4. generate with the KV cache: the same tokens on 1, 2 and 3 ranks (greedy)
printf '1,2,3\n5 6 7 8 9\n200,100\n' > p.txt
GX=("" "--prefill-chunk 4" "--groups 2") # other item sizes: the experts' rows per item differ
for P in 1 2 3; do
    mpirun_t 120 $P generate --init ref.bin --prompt-file p.txt --max-new-tokens 8 --tokens-out g$P.tok ${GX[$((P - 1))]} \
        > g$P.out 2>&1 || bad "generate P=$P" "$(tail -n 2 g$P.out | tr '\n' ' ')"
done
[ -s g1.tok ] && cmp -s g1.tok g2.tok && cmp -s g1.tok g3.tok \
    && ok "generate: the same tokens on 1, 2 (prefill chunks of 4) and 3 ranks (2 groups)" \
    || bad "generate" "$(paste -d' ' g1.tok g2.tok g3.tok | head -2)"

# 4b. bf16 (oneDNN): mixtral-tiny runs, learns (6 steps: the last loss 0.2 below the first) and
# gives the same bits on 1 and 2 stages (zb-h1); a CPU without native bf16 skips it
BFC="--preset mixtral-tiny --steps 6 --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0 --log-every 100 --backend onednn --precision bf16"
mpirun_t 120 1 train $BFC --metrics bf1.jsonl --save-final bf1.bin > bf1.out 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "no native bf16\|bf16 support" bf1.out; then
    echo "skip - bf16 Mixtral: this CPU has no native bf16 ($(grep -m1 error bf1.out | cut -c1-120))"
elif [ $rc -eq 0 ] && grep "backend:" bf1.out | grep -q "precision bf16" \
        && "$PY" -c "import sys; l=[float(x) for x in sys.argv[1:]]; sys.exit(0 if len(l) == 6 and l[-1] < l[0] - 0.2 else 1)" \
            $(losses bf1.jsonl); then
    ok "bf16 (oneDNN) Mixtral learns: loss $(losses bf1.jsonl | head -n 1 | cut -c1-6) -> $(losses bf1.jsonl | tail -n 1 | cut -c1-6) in 6 steps"
    if mpirun_t 120 2 train $BFC --schedule zb-h1 --metrics bf2.jsonl --save-final bf2.bin > bf2.out 2>&1 \
            && cmp -s bf1.bin bf2.bin && [ "$(losses bf1.jsonl)" = "$(losses bf2.jsonl)" ]; then
        ok "bf16 (oneDNN) Mixtral: 2 stages (zb-h1) bit-identical to 1"
    else bad "bf16 2 stages" "$(tail -n 2 bf2.out | tr '\n' ' ')"; fi
else bad "bf16 Mixtral run" "rc $rc $(losses bf1.jsonl | tr '\n' ' ') $(tail -n 2 bf1.out | tr '\n' ' ')"; fi

# 5. refusals, each naming the setting
refused() { # refused NAME PATTERN RANKS ARGS...
    local name=$1 pat=$2 r=$3
    shift 3
    mpirun_t 60 "$r" "$@" > bad.out 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pat" bad.out; then ok "refused: $name"
    else bad "refused: $name" "rc=$rc $(tail -n 2 bad.out | tr '\n' ' ')"; fi
}
refused "top-k above the expert count" "--experts-per-token is out of range" 1 train $COMMON --experts-per-token 6
refused "no experts" "--n-experts is out of range" 1 train $COMMON --n-experts 0
refused "a negative capacity factor" "--capacity-factor is out of range" 1 train $COMMON --capacity-factor -1
refused "--ep not dividing the 5 experts" "--ep 2: it must divide --n-experts" 2 train $COMMON --ep 2 --dp 2
refused "--tp on a MoE model" "does not split the experts" 2 train $COMMON --tp 2
refused "an unknown router" "router" 1 train $COMMON --router top1
finish
