#!/bin/bash
# test_docmask.sh — document masking of packed sequences (--doc-mask 1, issue 40) in whole
# training runs:
#   - against the independent float64 torch model with the block-diagonal mask
#     (tests/reference/torch_docmask.py: GPT-2 with positions continuing, Llama with rotary
#     positions restarting; documents across the tile edges; the step's loss and every
#     gradient within 1e-5): the cpu backend's tiled path on 2 stages; the full tier adds its
#     full path and the onednn backend in fp32;
#   - the bits: 3 stages (a middle stage finds the documents in the batch it reads) = 1 stage,
#     selective recomputation = none, zb-h1 on 2 stages (deferred weight parts) = 1 stage;
#     Llama restarting on 2 stages = 1;
#   - no document token in the data (text bytes, document token 0): --doc-mask 1 is the
#     unmasked run bit for bit; the control: Markov data (token 0 occurs) changes the loss;
#   - bad settings end every rank with the cause.
# Op by op: tests/unit/test_attention.c (each document alone), test_onednn.c, test_cuda.c
# (tests/lib/cuda_emu.sh). Every mpiexec runs under a timeout; shapes are tiny, one thread.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
need_torch
cd "$WORK"
COMMON="--preset tiny --max-seq-len 160 --seq-len 160 --steps 2 --batch 2 --microbatches 2 --eval-every 0
        --val-batches 1 --progress 0 --log-every 100 --threads 1"
same() { # same NAME A B: the same final weights and losses, bit for bit
    if [ -s "$2.bin" ] && cmp -s "$2.bin" "$3.bin" && [ -n "$(losses "$2.jsonl")" ] &&
        [ "$(losses "$2.jsonl")" = "$(losses "$3.jsonl")" ]; then ok "$1"
    else bad "$1" "$2 and $3 differ"; fi
}

# 1. the torch reference
ref() { # ref NAME LAUNCHER EXTRA...
    local name=$1 launcher=$2
    shift 2
    if timeout -k 5 300 "$PY" "$SRC/tests/reference/torch_docmask.py" --pipelm "$PIPELM" --launcher "$launcher" \
            -- --threads 1 "$@" > "ref_$name.out" 2>&1; then ok "torch reference, $name: $(grep PASS "ref_$name.out")"
    else bad "torch reference, $name" "$(grep -A3 '^FAIL' "ref_$name.out" | tr '\n' ' ' | cut -c1-600)"; fi
}
if [ "$TORCH" = 1 ]; then
    ref "cpu tiled path, 2 stages" "$MPIEXEC -n 2" --backend cpu --backend-opt attention=tiled
    if full_tier; then
        ref "cpu full path" "" --backend cpu
        ref "onednn fp32" "" --backend onednn
    else full_only "the torch reference on the cpu full path and onednn fp32"; fi
fi

# 2. the bits across stages, recomputation and schedules (Markov data: its document token is 0)
DM="--doc-mask 1"
run p1 1 $DM && run p3 3 $DM --stages 3 && same "3 stages = 1 stage, bit for bit" p3 p1
run sel 1 $DM --recompute selective && same "selective recomputation = none, bit for bit" sel p1
run zb 2 $DM --stages 2 --schedule zb-h1 && same "zb-h1 on 2 stages = 1 stage, bit for bit" zb p1
LL="--preset llama-tiny --max-seq-len 160 --doc-positions restart"
run l1 1 $DM $LL && run l2 2 $DM $LL --stages 2 && same "Llama, positions restarting: 2 stages = 1" l2 l1

# 3. no document token: the unmasked run's bits; the control: Markov data has one
awk 'BEGIN { for (i = 0; i < 400; i++) printf "packed documents without a NUL byte, line %d\n", i }' > plain.txt
TX="--data text:plain.txt --val-data text:plain.txt"
run tm 1 $DM $TX && run tu 1 $TX && same "no document token in the data: --doc-mask 1 = unmasked, bit for bit" tm tu
run pu 1
if [ -s pu.bin ] && [ -s p1.bin ] && ! cmp -s pu.bin p1.bin; then
    ok "control: with document tokens in the data the mask changes the run"
else bad "control" "masked and unmasked Markov runs agree, or a run failed: the comparisons prove nothing"; fi

# 4. bad settings: every rank ends with the cause
expect "--doc-positions restart refused for GPT-2's learned positions" 2 "needs rotary positions" \
    mpirun_t 60 2 train $COMMON $DM --doc-positions restart --stages 2
expect "a document token outside the vocabulary is refused" 2 "outside the vocabulary" \
    mpirun_t 60 2 train $COMMON $DM --doc-token 256 --stages 2
expect "--doc-mask 2 is refused" 2 "out of range" mpirun_t 60 1 train $COMMON --doc-mask 2

finish
