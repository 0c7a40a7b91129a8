#!/bin/bash
# test_exact.sh — `--grad-accum exact` (src/util/exact.h): each micro-batch's weight
# gradient in 128-bit fixed point, summed as integers over micro-batches, replicas and the
# tied embedding's two ends, rounded to fp32 once; the loss and the gradient norm summed the
# same way. So a step's result does not depend on the layout at a fixed --tp:
#   - bits (losses and gradient norms in the metrics file, final weights): T = 2 x D = 2 (4 ranks, M = 2) and
#     T = 2 x P = 2 against T = 2 alone with M = 4; D = 2 against one process (1f1b), under a
#     zero-bubble schedule with P = 2 and ZeRO-1, zb-v, interleaved chunks with full
#     recomputation, and Llama D = 2 with ZeRO-1;
#   - the control: the float mode (default) at D = 2 is NOT one process's bits, so the
#     comparisons above can see an order of summation;
#   - the exact mode against the float mode: every step's loss within relative 1e-5;
#   - the float mode is the default: a run without --grad-accum is `--grad-accum float` bit for
#     bit, and the same bits run to run (compared inside the test: a recorded md5 holds on one
#     processor only, OpenBLAS sums in another order elsewhere); a bad value, and TP with kv
#     heads shared by several TP ranks, are refused by name.
# Every run uses one thread a rank (the products' bits depend on the thread count). Every
# mpiexec runs under a timeout; 4 ranks on a small machine oversubscribe it: shapes are tiny.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
COMMON="--preset tiny --steps 3 --batch 8 --seq-len 32 --eval-every 0 --progress 0 --log-every 100 --threads 1"

# norms FILE: the step gradient norms of a metrics file, exactly as written
norms() { grep '"event":"step"' "$1" | sed 's/.*"grad_norm":\([^,]*\),.*/\1/'; }
# same A B: the same final weights, losses and gradient norms, to the last digit written
same() {
    [ -s "$1.bin" ] && cmp -s "$1.bin" "$2.bin" && [ -n "$(losses "$1.jsonl")" ] &&
        [ "$(losses "$1.jsonl")" = "$(losses "$2.jsonl")" ] && [ "$(norms "$1.jsonl")" = "$(norms "$2.jsonl")" ]
}
# check NAME A B: same A B, or a failure naming what differs
check() {
    if same "$2" "$3"; then ok "$1"
    else bad "$1" "$2 and $3 differ: weights, losses or norms (weights $(md5sum < "$2.bin" | cut -c1-8) vs $(md5sum < "$3.bin" | cut -c1-8))"; fi
}
EX="--grad-accum exact"

# tensor parallelism: T = 2 alone is the reference; D = 2 and P = 2 at T = 2 give its bits
run t2 2 $EX --tp 2 --microbatches 4
grep -q "gradient sums: exact" t2.out && ok "the stage table says the sums are exact, and their memory" \
    || bad "banner" "no 'gradient sums: exact' line"
run t2d2 4 $EX --tp 2 --dp 2 --microbatches 2 && check "exact: T=2 x D=2 (M=2) = T=2 alone (M=4), bit for bit" t2d2 t2
run t2p2 4 $EX --tp 2 --stages 2 --microbatches 4 && check "exact: T=2 x P=2 = T=2 alone, bit for bit" t2p2 t2

# data parallelism without TP: one process is the reference
run one 1 $EX --microbatches 4
run d2 2 $EX --dp 2 --microbatches 2 && check "exact: D=2 (1f1b) = one process, bit for bit" d2 one
run d2p2zb 4 $EX --dp 2 --stages 2 --zero 1 --schedule zb-h1 --microbatches 2 \
    && check "exact: D=2 x P=2, zb-h1, ZeRO-1 = one process, bit for bit" d2p2zb one
run p2v 2 $EX --stages 2 --schedule zb-v --microbatches 4 \
    && check "exact: P=2 zb-v (V-shaped chunks, the tied sum on one rank) = one process, bit for bit" p2v one
run p2i 2 $EX --stages 2 --chunks-per-rank 2 --schedule interleaved-1f1b --recompute full --microbatches 4 \
    && check "exact: P=2 x 2 chunks, interleaved-1f1b, full recomputation = one process, bit for bit" p2i one

# Llama (untied head, RMSNorm, SwiGLU): D = 2 with ZeRO-1
LL="--preset llama-tiny --batch 8 --seq-len 32"
run ll1 1 $EX $LL --microbatches 4
run lld2 2 $EX $LL --dp 2 --zero 1 --microbatches 2 && check "exact: Llama D=2, ZeRO-1 = one process, bit for bit" lld2 ll1

# the control: the float mode sums in each layout's order
run f1 1 --microbatches 4
run fd2 2 --dp 2 --microbatches 2
if [ -s f1.bin ] && [ -s fd2.bin ] && ! cmp -s f1.bin fd2.bin; then
    ok "control: the float mode's D=2 differs from one process (the comparisons above can fail)"
else bad "control" "float D=2 and one process agree bit for bit, or a run failed: the check proves nothing"; fi
if msg=$(close one.jsonl f1.jsonl); then ok "exact against float, one process: losses within 1e-5 ($msg)"
else bad "exact against float" "$msg"; fi
if msg=$(close t2.jsonl f1.jsonl); then ok "exact T=2 against float one process: losses within 1e-5 ($msg)"
else bad "exact T=2 against float" "$msg"; fi

# the default run is the float mode, and keeps its bits run to run (compared here, not with an
# md5 recorded on another processor: OpenBLAS's kernels sum in another order on another CPU)
for tag in w wf w2; do
    opt=; [ $tag = wf ] && opt="--grad-accum float"
    OMP_NUM_THREADS=1 "$PIPELM" train --steps 6 --save-final $tag.bin $opt > $tag.out 2>&1
done
if [ -s w.bin ] && cmp -s w.bin wf.bin && cmp -s w.bin w2.bin; then
    ok "the default run is --grad-accum float, bit for bit, and repeats ($(md5sum < w.bin | cut -c1-8))"
else bad "default bits" "the default run, --grad-accum float and a rerun differ (or a run failed: $(tail -n 1 w.out))"; fi

finish
