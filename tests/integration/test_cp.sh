#!/bin/bash
# test_cp.sh — context parallelism (--cp C): the C ranks of a stage each hold chunks i and
# 2C-1-i of every sequence; attention passes the keys and values around a ring of the C ranks
# (or all-gathers them, --cp-comm allgather) and their gradients back (cp.h). So:
#   - against one process: the attention's sums run over other tiles and the C ranks' weight
#     gradients are added by the replicas' reduction, so tolerances: every step's loss within
#     relative 1e-5, every gradient tensor of step 1 (--dump-grads, converted to safetensors)
#     within 1e-5 of the tensor's largest magnitude; GPT-2 (learned positions) and Llama (RoPE,
#     NKV = 2) at C = 2 and C = 3, the ring and the all-gather;
#   - bits: the same run after run, C = 2 x P = 2 the bits of C = 2 alone, ZeRO-1 of C = 2 x
#     D = 2 the bits of its unsharded run; every schedule and recomputation within 1e-5;
#   - checkpoints do not depend on C: a C = 2 save resumes at C = 1 and a C = 1 save at C = 2;
#   - pipelm tune searches C from costs measured at C = 1, and keeps a measured C; pipelm
#     schedule --cp C predicts C ranks' actions and activations;
#   - refusals by name: a sequence not divisible by 2C, --tp, the onednn backend (bf16), a
#     world that does not fit;
#   - a rank failing or killed inside the CP exchange ends the job within seconds, named with
#     the phase.
# Every mpiexec runs under a timeout. Ranks are oversubscribed on small machines: shapes are tiny.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
COMMON="--preset tiny --steps 5 --batch 8 --seq-len 48 --microbatches 2 --eval-every 0 --progress 0 --log-every 100"

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
# near TAG REF WHAT: losses only
near() {
    local msg
    if msg=$(close "$1.jsonl" "$2.jsonl" 1e-5); then ok "$3: losses within 1e-5 of one process ($msg)"
    else bad "$3" "too far from one process ($msg)"; fi
}

# GPT-2 (learned positions) at C = 2 and C = 3 (48 tokens: 4 chunks of 12, 6 of 8)
run ref 1 --dump-grads ref.g.bin
run cp2 2 --cp 2 --dump-grads cp2.g.bin && against cp2 ref "GPT-2 C=2"
run cp3 3 --cp 3 --dump-grads cp3.g.bin && against cp3 ref "GPT-2 C=3"
grep -q "context parallel: C=2 ranks per stage" cp2.out \
    && ok "C=2: the run says how the sequence is split" || bad "C=2 banner" "no context-parallel line"

# Llama (RoPE, grouped-query attention with NKV = 2)
LL="--arch llama --n-kv-head 2"
run llref 1 $LL --dump-grads llref.g.bin
run ll2 2 $LL --cp 2 --dump-grads ll2.g.bin && against ll2 llref "Llama NKV=2 C=2"

# the all-gather form (--cp-comm allgather) against one process and the ring
run ag2 2 --cp 2 --cp-comm allgather --dump-grads ag2.g.bin && against ag2 ref "GPT-2 C=2 all-gather"

# bits: run to run, and over a pipeline split
run cp2again 2 --cp 2
same cp2 cp2again && ok "C=2: the same bits run after run" || bad "C=2 repeat" "two runs differ"
run cp2p2 4 --cp 2 --stages 2
same cp2 cp2p2 && ok "C=2 x P=2: bit-identical to C=2 alone" || bad "C=2 P=2" "differs from C=2 alone"

# checkpoints do not depend on C: C = 2 -> C = 1 and C = 1 -> C = 2 from step 3
if run ck2 2 --cp 2 --ckpt-dir ck2 --ckpt-every 3; then
    same ck2 cp2 && ok "a checkpointed C=2 run is the straight run" || bad "ck2" "saving changed the run"
    run r21 1 --resume ck2/ckpt_00000003.h5 && { msg=$(close r21.jsonl cp2.jsonl 1e-5) \
        && ok "C=2 checkpoint resumed at C=1: losses within 1e-5 of the C=2 run ($msg)" || bad "resume C=1" "$msg"; }
fi
if run ck1 1 --ckpt-dir ck1 --ckpt-every 3; then
    run r12 2 --cp 2 --resume ck1/ckpt_00000003.h5 && { msg=$(close r12.jsonl ref.jsonl 1e-5) \
        && ok "C=1 checkpoint resumed at C=2: losses within 1e-5 of the C=1 run ($msg)" || bad "resume C=2" "$msg"; }
fi

# the full tier: Llama at C = 3, replicas, exact sums, schedules and recomputation (4 micro-batches, two
# stages of C = 2)
if full_tier; then
    run ll3 3 $LL --cp 3 --dump-grads ll3.g.bin && against ll3 llref "Llama NKV=2 C=3"
    run ag3l 3 $LL --cp 3 --cp-comm allgather && near ag3l llref "Llama C=3 all-gather"
    run cp2d2 4 --cp 2 --dp 2 --microbatches 1 && near cp2d2 ref "C=2 x D=2"
    run cp2z2 4 --cp 2 --dp 2 --microbatches 1 --zero 1
    same cp2d2 cp2z2 && ok "C=2 x D=2: ZeRO-1 bit-identical to unsharded" || bad "C=2 ZeRO-1" "differs from unsharded"
    run cp2x 2 --cp 2 --grad-accum exact && run refx 1 --grad-accum exact && near cp2x refx "C=2 --grad-accum exact"

    run ref4 1 --microbatches 4
    for s in gpipe zb-h1 interleaved-1f1b; do
        run "s_$s" 4 --cp 2 --stages 2 --microbatches 4 --schedule "$s" && near "s_$s" ref4 "C=2 x P=2 --schedule $s"
    done
    run rcsel 2 --cp 2 --recompute selective && near rcsel ref "C=2 --recompute selective"
    run rcfull 2 $LL --cp 2 --recompute full && near rcfull llref "Llama C=2 --recompute full"
else
    full_only "Llama C=3 (ring, all-gather); C=2 x D=2 with ZeRO-1; --grad-accum exact; schedules gpipe, zb-h1, interleaved-1f1b; recomputation"
fi

# pipelm tune knows C: from costs measured at --cp 1 it plays C = 2 and 4 on 4 ranks (each a
# rank's actions and activations / C plus the K/V exchanges); a costs file measured at
# --cp 2 says so (key cp) and is played at C = 2 only
if mpirun_t 120 1 bench $COMMON --steps 2 --warmup 1 --costs-out c1.txt > c1.out 2>&1 &&
    "$PIPELM" tune --costs c1.txt --ranks 4 --batch 8 --costs-microbatches 2 --json t4.json -- --preset tiny \
        --seq-len 48 > t4.out 2>&1; then
    grep -q '"cp":2}' t4.json && grep -q '"cp":4}' t4.json && grep -q -- '--cp 2 ' t4.json \
        && ok "tune --ranks 4 plays --cp 2 and --cp 4 layouts" || bad "tune C" "no --cp candidates in t4.json"
else
    bad "tune C" "$(tail -n 2 c1.out t4.out | tr '\n' ' ')"
fi
# the simulator: pipelm schedule --costs c1.txt --cp 2 halves a rank's activations
if [ -f c1.txt ] && "$PIPELM" schedule --stages 1 --microbatches 2 --costs c1.txt > s1.out 2>&1 &&
    "$PIPELM" schedule --stages 1 --microbatches 2 --costs c1.txt --cp 2 > s2.out 2>&1; then
    a1=$(sed -n 's/.*activations \([0-9.]*\) MB.*/\1/p' s1.out); a2=$(sed -n 's/.*activations \([0-9.]*\) MB.*/\1/p' s2.out)
    grep -q -- "--cp 2: F, B, I, W and activations divided by 2" s2.out && [ -n "$a1" ] && [ -n "$a2" ] &&
        awk -v a="$a1" -v b="$a2" 'BEGIN { exit !(b > 0.45 * a && b < 0.55 * a) }' \
        && ok "pipelm schedule --cp 2: a rank's activations $a2 MB against $a1 MB" || bad "schedule --cp" "$a1 / $a2 MB"
else
    bad "schedule --cp" "$(tail -n 2 s1.out s2.out | tr '\n' ' ')"
fi
if mpirun_t 120 2 bench $COMMON --steps 2 --warmup 1 --cp 2 --costs-out c2.txt > c2.out 2>&1 &&
    "$PIPELM" tune --costs c2.txt --ranks 4 --batch 8 --costs-microbatches 2 --json t2.json -- --preset tiny \
        --seq-len 48 > t2.out 2>&1; then
    grep -qx "cp 2" c2.txt && ! grep -q '"cp":[14]}' t2.json && grep -q '"cp":2}' t2.json \
        && ok "costs measured at --cp 2 say so and are played at C = 2 only" || bad "tune C0" "$(grep -c cp t2.json)"
else
    bad "tune C0" "$(tail -n 2 c2.out t2.out | tr '\n' ' ')"
fi

# refusals by name
mpirun_t 60 2 train $COMMON --cp 2 --seq-len 42 > bad1.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--cp 2: --seq-len 42 is not divisible by 2C = 4" bad1.out \
    && ok "--seq-len 42 at --cp 2 refused by name" || bad "T % 2C" "rc $rc: $(head -c 300 bad1.out)"
mpirun_t 60 4 train $COMMON --cp 2 --tp 2 > bad2.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--cp 2: --tp (tensor parallelism) does not run with context parallelism" bad2.out \
    && ok "--cp 2 --tp 2 refused by name" || bad "CP x TP" "rc $rc: $(head -c 300 bad2.out)"
mpirun_t 60 2 train $COMMON --cp 2 --backend onednn --precision bf16 > bad4.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--cp 2: a backend other than cpu" bad4.out \
    && ok "--cp 2 on the onednn backend (bf16) refused by name" || bad "CP x onednn" "rc $rc: $(head -c 300 bad4.out)"
mpirun_t 60 3 train $COMMON --cp 2 > bad3.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--cp 2 does not fit 3 ranks" bad3.out \
    && ok "--cp 2 on 3 ranks refused" || bad "C x D x P" "rc $rc: $(head -c 300 bad3.out)"

# a rank failing inside the CP exchange: the job ends within seconds, the rank and phase named
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --cp 2 --stages 2 --fail-rank 3 --fail-step 2 --fail-at cp --watchdog 20 > fail.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 30 ] \
    && grep -q "rank 3: error: injected failure.*inside the CP exchange of the keys and values, forward, step 2" fail.out \
    && ok "a rank failing inside the CP exchange ends every rank in ${secs} s, rank and phase named" \
    || bad "CP failure" "rc $rc after ${secs} s: $(grep -m3 -i 'error\|fail' fail.out | tr '\n' ' ')"
# killed (SIGKILL) with its peer inside the same gather: mpiexec ends the job within seconds
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --cp 2 --stages 2 --fail-rank 3 --fail-step 2 --fail-at cp-kill --watchdog 20 > kill.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 30 ] \
    && grep -q "rank 3: note: --fail-at cp-kill: killing this rank (SIGKILL) inside the CP exchange of the keys and values, forward, step 2" kill.out \
    && grep -q "BAD TERMINATION" kill.out \
    && ok "a rank killed with SIGKILL inside the CP exchange: the job ends in ${secs} s (rc $rc), the killed rank named" \
    || bad "CP kill" "rc $rc after ${secs} s: $(tail -n 4 kill.out | tr '\n' ' ')"

finish
