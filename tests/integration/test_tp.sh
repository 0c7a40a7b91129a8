#!/bin/bash
# test_tp.sh — tensor parallelism (--tp T): the T ranks of a stage share every block
# (Megatron: heads and MLP sliced, one all-reduce after each output projection and one per
# norm in the backward), summed in rank order. So:
#   - against one process: float sums in another order, so tolerances: every step's loss
#     within relative 1e-5, every gradient tensor of step 1 (--dump-grads, converted to
#     safetensors) within 1e-5 of the tensor's largest magnitude; GPT-2 at T = 2 and 3, Llama
#     with NKV = 2 at T = 2 (kv heads split) and T = 4 (kv heads replicated on 2 ranks each);
#   - the token table and head matrix vocabulary-parallel (each rank holds a slice of the rows
#     and of the logits, never gathered; at T = 3 the last slice is shorter and padded);
#   - bits: the same run after run, and across pipeline splits and ZeRO-1 at a fixed T;
#   - checkpoints stay whole: a T = 2 save resumes at T = 1 and a T = 1 save at T = 2, the
#     losses continuing within 1e-6 of the straight runs;
#   - pipelm eval at T = 2 x P = 2 gives one process's loss; model files stay whole;
#   - refusals: a world size that does not fit T x D x P, a head count T does not divide;
#   - a rank killed inside a TP all-reduce ends the job within seconds, named with the phase.
# Every mpiexec runs under a timeout. Ranks are oversubscribed on small machines: shapes are tiny.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
COMMON="--preset tiny --steps 5 --batch 8 --seq-len 32 --microbatches 2 --eval-every 0 --progress 0 --log-every 100"

same() { cmp -s "$1.bin" "$2.bin" && [ "$(losses "$1.jsonl")" = "$(losses "$2.jsonl")" ]; }
# grads TAG REF: step 1's gradients of TAG within 1e-5 of REF's, tensor by tensor
grads() {
    "$PIPELM" convert --to hf "$1.g.bin" "$1.g.safetensors" > /dev/null 2>&1 &&
        "$PIPELM" convert --to hf "$2.g.bin" "$2.g.safetensors" > /dev/null 2>&1 &&
        python3 "$SRC/tests/reference/grads_close.py" "$1.g.safetensors" "$2.g.safetensors" 1e-5
}
# against TAG REF WHAT: losses and gradients of TAG against the one-process REF
against() {
    local msg
    if msg=$(close "$1.jsonl" "$2.jsonl" 1e-5); then ok "$3: losses within 1e-5 of one process ($msg)"
    else bad "$3 losses" "too far from one process ($msg)"; fi
    if msg=$(grads "$1" "$2"); then ok "$3: every gradient tensor within 1e-5 of its max ($msg)"
    else bad "$3 gradients" "$msg"; fi
}

# GPT-2 at T = 2 and T = 3 (C 48, 6 heads: 3 divides the heads and the MLP)
run ref 1 --dump-grads ref.g.bin
run tp2 2 --tp 2 --dump-grads tp2.g.bin && against tp2 ref "GPT-2 T=2"
grep -q "tensor parallel: T=2 ranks per stage" tp2.out && grep -q "stage  replica  tp  rank  host" tp2.out \
    && ok "T=2: the stage table and the (stage, replica, tp) grid show T" || bad "T=2 table" "no T in the stage table"
grep -q "the replicated tensors are bit-identical on the 2 TP ranks" tp2.out \
    && ok "T=2: the replicated tensors stayed the same bits on both TP ranks" || bad "T=2 replicas" "no replica check"
G3="--n-embd 48 --n-head 6"
run ref3 1 $G3 --dump-grads ref3.g.bin
run tp3 3 $G3 --tp 3 --dump-grads tp3.g.bin && against tp3 ref3 "GPT-2 T=3"

# Llama, NKV = 2: split at T = 2, replicated at T = 4
LL="--arch llama --n-kv-head 2"
run llref 1 $LL --dump-grads llref.g.bin
run ll2 2 $LL --tp 2 --dump-grads ll2.g.bin && against ll2 llref "Llama NKV=2 T=2"
run ll4 4 $LL --tp 4 --dump-grads ll4.g.bin && against ll4 llref "Llama NKV=2 T=4 (kv heads replicated)"
# Llama's untied head under --dp, ZeRO-1
run llref4 1 $LL --microbatches 4
run ll2d2 4 $LL --tp 2 --dp 2 --zero 1
if msg=$(close ll2d2.jsonl llref4.jsonl 1e-5); then ok "Llama T=2 x D=2 ZeRO-1: losses within 1e-5 of one process ($msg)"
else bad "Llama T=2 D=2" "too far from one process ($msg)"; fi

# bits at T = 2: run to run, over a pipeline split, ZeRO-1 on or off
run tp2again 2 --tp 2
same tp2 tp2again && ok "T=2: the same bits run after run" || bad "T=2 repeat" "two runs differ"
run tp2p2 4 --tp 2 --stages 2
same tp2 tp2p2 && ok "T=2 x P=2: bit-identical to T=2 alone" || bad "T=2 P=2" "differs from T=2 alone"
run tp2d2 4 --tp 2 --dp 2 --microbatches 1
if msg=$(close tp2d2.jsonl ref.jsonl 1e-5); then ok "T=2 x D=2: losses within 1e-5 of one process ($msg)"
else bad "T=2 D=2" "too far from one process ($msg)"; fi
run tp2z2 4 --tp 2 --dp 2 --microbatches 1 --zero 1
same tp2d2 tp2z2 && ok "T=2 x D=2: ZeRO-1 bit-identical to unsharded" || bad "T=2 ZeRO-1" "differs from unsharded"

# bf16 on the oneDNN backend: T = 2 against one process in bf16 (the sliced products round
# their bf16 inputs alike, but the row-parallel sums add fp32 partial products: not the bits;
# measured 2e-5 relative)
run bf1 1 --backend onednn --precision bf16 --threads 1 && run bf2 2 --tp 2 --backend onednn --precision bf16 --threads 1 &&
    if msg=$(close bf2.jsonl bf1.jsonl 1e-3); then ok "bf16 (onednn): T=2 losses within 1e-3 of one process ($msg)"
    else bad "bf16 T=2" "too far from one process ($msg)"; fi

# checkpoints: T = 2 -> T = 1 and T = 1 -> T = 2 from step 3
if run ck2 2 --tp 2 --ckpt-dir ck2 --ckpt-every 3; then
    same ck2 tp2 && ok "a checkpointed T=2 run is the straight run" || bad "ck2" "saving changed the run"
    run r21 1 --resume ck2/ckpt_00000003.h5 && { msg=$(close r21.jsonl tp2.jsonl 1e-6) \
        && ok "T=2 checkpoint resumed at T=1: losses within 1e-6 of the T=2 run ($msg)" || bad "resume T=1" "$msg"; }
fi
if run ck1 1 --ckpt-dir ck1 --ckpt-every 3; then
    run r12 2 --tp 2 --resume ck1/ckpt_00000003.h5 && { msg=$(close r12.jsonl ref.jsonl 1e-6) \
        && ok "T=1 checkpoint resumed at T=2: losses within 1e-6 of the T=1 run ($msg)" || bad "resume T=2" "$msg"; }
fi

# pipelm eval of a T=2 checkpoint at T=1 and T=2 x P=2: the same loss to the 6 decimals printed
if [ -f ck2/ckpt_00000005.h5 ]; then
    "$PIPELM" eval --preset tiny --seq-len 32 --batch 8 --resume ck2/ckpt_00000005.h5 > ev1.out 2>&1
    mpirun_t 60 4 eval --preset tiny --seq-len 32 --batch 8 --tp 2 --stages 2 --resume ck2/ckpt_00000005.h5 > ev2.out 2>&1
    l1=$(grep -o "eval | loss [0-9.]*" ev1.out); l2=$(grep -o "eval | loss [0-9.]*" ev2.out)
    [ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "pipelm eval --tp 2 --stages 2: the loss of one process ($l2)" \
        || bad "eval --tp 2" "'$l1' against '$l2' $(grep -m2 error ev2.out)"
else
    bad "eval --tp 2" "no final checkpoint ck2/ckpt_00000005.h5"
fi

# model files stay whole: a T=2 run's llm.c file initialises T=1 and T=2 alike, and its
# safetensors export holds the llm.c file's tensors exactly
run in1 1 --init tp2.bin
run in2 2 --tp 2 --init tp2.bin
if msg=$(close in2.jsonl in1.jsonl 1e-5); then ok "--init of a T=2 file at T=2 and T=1: losses within 1e-5 ($msg)"
else bad "--init T=2" "$msg"; fi
if mpirun_t 120 2 train $COMMON --tp 2 --save-final st2.safetensors > st2.out 2>&1 &&
    "$PIPELM" convert --to hf tp2.bin tp2.safetensors > /dev/null 2>&1 &&
    msg=$(python3 "$SRC/tests/reference/grads_close.py" st2.safetensors tp2.safetensors 0); then
    ok "T=2 --save-final FILE.safetensors: the llm.c file's tensors exactly ($msg)"
else
    bad "T=2 safetensors" "$(grep -m2 error st2.out) $msg"
fi

# refusals
mpirun_t 60 3 train $COMMON --tp 2 > bad1.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--tp 2 does not fit 3 ranks" bad1.out && grep -q -- "--tp 3 --dp 1 --stages 1" bad1.out \
    && ok "--tp 2 on 3 ranks refused with the layouts that fit" || bad "wrong world size" "rc $rc: $(head -c 300 bad1.out)"
mpirun_t 60 4 train $COMMON --tp 2 --stages 3 > bad2.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "this job can run --tp 2 --dp 1 --stages 2" bad2.out \
    && ok "--tp 2 --stages 3 on 4 ranks refused with the layouts that fit" || bad "T x P" "rc $rc: $(head -c 300 bad2.out)"
mpirun_t 60 3 train $COMMON --tp 3 > bad3.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--tp 3 does not divide the head count (--n-head) 4" bad3.out \
    && ok "--tp 3 with 4 heads refused by name" || bad "head count" "rc $rc: $(head -c 300 bad3.out)"
mpirun_t 60 3 train $COMMON $LL --n-head 6 --n-embd 48 --tp 3 > bad4.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--tp 3 does not divide the key/value head count" bad4.out \
    && ok "--tp 3 with 2 kv heads refused by name" || bad "kv heads" "rc $rc: $(head -c 300 bad4.out)"

# a rank killed inside a TP all-reduce: the job ends within seconds, the rank and phase named
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --tp 2 --stages 2 --fail-rank 3 --fail-step 2 --fail-at tp --watchdog 20 > fail.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 30 ] && grep -q "rank 3: error: injected failure.*inside a TP all-reduce of the forward" fail.out \
    && ok "a rank failing inside a TP all-reduce ends every rank in ${secs} s, rank and phase named" \
    || bad "TP failure" "rc $rc after ${secs} s: $(grep -m3 -i 'error\|fail' fail.out | tr '\n' ' ')"

# a rank killed (SIGKILL) inside a TP all-reduce, its peers inside the same gather: mpiexec
# ends the job within seconds ("BAD TERMINATION"); the rank's note before its death names it
# and the phase (a killed process says nothing itself: under srun it is srun's "task 3:
# Killed" that names it). Which exit code mpiexec reports is not checked: it is the dead
# process's 9 or, when mpiexec's SIGTERM of a peer is seen first, that peer's (2 failures in 4
# runs on one machine)
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --tp 2 --stages 2 --fail-rank 3 --fail-step 2 --fail-at tp-kill --watchdog 20 > kill.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 30 ] && grep -q "rank 3: note: --fail-at tp-kill: killing this rank (SIGKILL) inside the TP all-reduce of the forward, step 2" kill.out \
    && grep -q "BAD TERMINATION" kill.out \
    && ok "a rank killed with SIGKILL inside a TP all-reduce: the job ends in ${secs} s (rc $rc), the killed rank named" \
    || bad "TP kill" "rc $rc after ${secs} s: $(tail -n 4 kill.out | tr '\n' ' ')"

# bench: the TP all-reduce time and share
if mpirun_t 120 2 bench --preset tiny --batch 8 --seq-len 32 --microbatches 2 --steps 2 --warmup 1 --tp 2 \
    --json b.json > b.out 2>&1; then
    grep -q '"tp":2' b.json && grep -q '"tp_allreduce_ms":' b.json && grep -q '"tp_allreduce_share":' b.json \
        && grep -q "TP all-reduce .* ms per step" b.out \
        && ok "bench --tp 2: tp, tp_allreduce_ms and tp_allreduce_share reported" || bad "bench keys" "$(head -c 300 b.json)"
else
    bad "bench --tp 2" "$(grep -m2 error b.out)"
fi

# the full tier: schedules, chunks, recomputation, and three dimensions at once
if full_tier; then
    run tp2m4 2 --tp 2 --microbatches 4
    for x in "--schedule zb-h1" "--schedule gpipe" "--recompute full" "--recompute selective" \
        "--chunks-per-rank 2 --schedule interleaved-1f1b --microbatches 4"; do
        tag=f$(echo "$x" | tr -cd 'a-z0-9')
        want=tp2
        case "$x" in *"--microbatches 4"*) want=tp2m4 ;; esac
        run "$tag" 4 --tp 2 --stages 2 $x && { same "$tag" $want && ok "T=2 x P=2 $x: the bits of T=2 alone" \
            || bad "T=2 P=2 $x" "differs from T=2 alone"; }
    done
    run f3d 8 --tp 2 --dp 2 --stages 2 --microbatches 1 --zero 1
    same f3d tp2d2 && ok "T=2 x D=2 x P=2 ZeRO-1: the bits of T=2 x D=2" || bad "3D" "differs from T=2 x D=2"
    run fll 4 $LL --tp 2 --stages 2
    same fll ll2 && ok "Llama T=2 x P=2: the bits of T=2 alone" || bad "Llama T=2 P=2" "differs"
    run fllt 1 $LL --tie-embeddings 1 --dump-grads fllt.g.bin
    run fllt2 4 $LL --tie-embeddings 1 --tp 2 --stages 2 --dump-grads fllt2.g.bin && against fllt2 fllt "tied Llama T=2 x P=2"
else
    full_only "T=2 x P=2 under other schedules, chunks and recomputation; T x D x P = 8 ranks; Llama T=2 x P=2"
fi
finish
