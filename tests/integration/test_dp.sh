#!/bin/bash
# test_dp.sh — data x pipeline parallelism (--dp D, --stages P, --zero 1): D replicas of a
# P-stage pipeline against the one-process run with the same global batch and D*M
# micro-batches. The replicas' gradient sum is in a fixed order, so:
#   - bits: identical run after run, across stage splits at fixed D, and with ZeRO-1 on or off;
#   - against one process: float sums in another order, so a tolerance (relative 1e-5 on every
#     step's loss; measured at about 1e-7 on the tiny preset);
#   - --dp 1 is the plain pipeline, bit-identical to one process;
#   - checkpoints: a D x P save resumes bitwise on D x P' (any P', ZeRO on or off) and
#     within the tolerance on other D;
#   - refusals (a world size that does not fit, a batch that does not split) name what would
#     work; a failing rank of one replica ends every rank of every replica, quickly, named.
# Every mpiexec runs under a timeout. Ranks are oversubscribed on small machines: shapes are tiny.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
STEPS=4
COMMON="--preset tiny --steps $STEPS --batch 8 --seq-len 32 --eval-every 0 --progress 0 --log-every 100"

same() { cmp -s "$1.bin" "$2.bin" && [ "$(losses "$1.jsonl")" = "$(losses "$2.jsonl")" ]; }

# the references: one process with D*M micro-batches
run ref4 1 --microbatches 4
run ref2 1 --microbatches 2

# --dp 1 is the plain pipeline
run d1p2 2 --microbatches 4 --dp 1
same d1p2 ref4 && ok "--dp 1 x 2 stages: bit-identical to one process" || bad "--dp 1" "differs from one process"

for D in 2 4; do
    M=$((4 / D))
    for P in 1 2; do
        tag=d${D}p$P
        run $tag $((D * P)) --dp $D --microbatches $M || continue
        grep -q "data parallel: $D replicas x $P stages" $tag.out && grep -q "stage  replica  rank  host" $tag.out \
            && ok "$tag: the (stage, replica) -> rank, host grid is printed" || bad "$tag" "no grid"
        if msg=$(close $tag.jsonl ref4.jsonl); then ok "$tag: losses within 1e-5 of one process ($msg)"
        else bad "$tag" "losses too far from one process ($msg)"; fi
    done
    same d${D}p1 d${D}p2 && ok "D=$D: bit-identical across P = 1 and 2 (the sum does not depend on the split)" \
        || bad "D=$D split" "P=1 and P=2 differ"
done
run d2p2again 4 --dp 2 --microbatches 2
same d2p2 d2p2again && ok "D=2 P=2: the same bits run after run" || bad "D=2 repeat" "two runs differ"
run d2p2split 4 --dp 2 --microbatches 2 --split 1,3
same d2p2 d2p2split && ok "D=2 P=2: split 1,3 gives the bits of split auto" || bad "D=2 split 1,3" "differs"
run d2p2zb 4 --dp 2 --microbatches 2 --schedule zb-h1
same d2p2 d2p2zb && ok "D=2 P=2: zb-h1 gives the bits of 1f1b" || bad "D=2 zb-h1" "differs"
# --stages instead of --dp
run s2 4 --stages 2 --microbatches 2
same d2p2 s2 && ok "--stages 2 on 4 ranks = --dp 2" || bad "--stages 2" "differs from --dp 2"

# ZeRO-1: the same bits as unsharded
run z2p2 4 --dp 2 --zero 1 --microbatches 2
same z2p2 d2p2 && ok "ZeRO-1 D=2 P=2: bit-identical to unsharded" || bad "ZeRO-1 D=2" "differs from unsharded"
run z4p1 4 --dp 4 --zero 1 --microbatches 1
same z4p1 d4p1 && ok "ZeRO-1 D=4 P=1: bit-identical to unsharded" || bad "ZeRO-1 D=4" "differs from unsharded"

# Llama: the same bits over P at fixed D, ZeRO-1 on or off
LL="--preset llama-tiny --batch 8 --seq-len 32"
run ll_ref 1 $LL --microbatches 4
run ll_d2p1 2 $LL --dp 2 --microbatches 2
run ll_z2p2 4 $LL --dp 2 --zero 1 --microbatches 2
same ll_d2p1 ll_z2p2 && ok "llama-tiny: D=2 x P=1 = D=2 x P=2 with ZeRO-1, bit for bit" || bad "llama D=2" "P=1 and P=2 ZeRO-1 differ"
if msg=$(close ll_d2p1.jsonl ll_ref.jsonl); then ok "llama-tiny D=2: losses within 1e-5 of one process ($msg)"
else bad "llama D=2" "losses too far from one process ($msg)"; fi

# checkpoints: save on 2 x 2 with ZeRO-1, resume on other layouts
if run ck22 4 --dp 2 --zero 1 --microbatches 2 --ckpt-dir ck --ckpt-every 2; then
    same ck22 d2p2 && ok "a checkpointed 2 x 2 run is the straight run" || bad "ck22" "saving changed the run"
    CK=ck/ckpt_00000002.h5
    run rz21 2 --dp 2 --microbatches 2 --resume $CK --ckpt-dir ck_a \
        && { cmp -s rz21.bin d2p2.bin && ok "2x2 ZeRO-1 checkpoint resumed on 2x1 unsharded: bit-identical continuation" \
             || bad "resume 2x1" "continuation differs from the straight run"; }
    run rz23 6 --dp 2 --zero 1 --stages 3 --microbatches 2 --resume $CK --ckpt-dir ck_b \
        && { cmp -s rz23.bin d2p2.bin && ok "2x2 checkpoint resumed on 2x3 ZeRO-1: bit-identical continuation" \
             || bad "resume 2x3" "continuation differs from the straight run"; }
    run r13 3 --microbatches 4 --resume $CK --ckpt-dir ck_c \
        && { msg=$(close r13.jsonl ref4.jsonl) && ok "2x2 checkpoint resumed on 1x3: losses within 1e-5 ($msg)" \
             || bad "resume 1x3" "$msg"; }
    run r11 1 --microbatches 4 --resume $CK --ckpt-dir ck_d \
        && { msg=$(close r11.jsonl ref4.jsonl) && ok "2x2 checkpoint resumed on one process: losses within 1e-5 ($msg)" \
             || bad "resume 1x1" "$msg"; }
    run r41 4 --dp 4 --microbatches 1 --resume $CK --ckpt-dir ck_e \
        && { msg=$(close r41.jsonl ref4.jsonl) && ok "2x2 checkpoint resumed on 4x1: losses within 1e-5 ($msg)" \
             || bad "resume 4x1" "$msg"; }
fi

# the overlap (8 MPI tests after every op, the update bucket by bucket with the gathers in
# flight) against the old order (tests at the blocks' ends, every gather waited for, one
# update): the same bits, with clipping on every step, unsharded and ZeRO-1, P = 1 and 2
for z in 0 1; do
    for P in 1 2; do
        run ov$z$P $((2 * P)) --dp 2 --zero $z --microbatches 2 --grad-clip 0.05 || continue
        PIPELM_DP_POLL=0 PIPELM_DP_DEFER=0 run old$z$P $((2 * P)) --dp 2 --zero $z --microbatches 2 --grad-clip 0.05 \
            || continue
        same ov$z$P old$z$P && ok "zero $z, P=$P, clipped: the overlapped reduction and update give the old order's bits" \
            || bad "overlap zero $z P=$P" "differs from the old order"
    done
done
same ov01 ov11 && ok "clipped: ZeRO-1 = unsharded, bucket by bucket" || bad "clipped ZeRO-1" "differs from unsharded"

mpirun_t 60 3 train $COMMON --dp 2 > bad1.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "does not fit 3 ranks" bad1.out && grep -q -- "--dp 3 --stages 1" bad1.out \
    && ok "--dp 2 on 3 ranks refused with the layouts that fit" || bad "wrong world size" "rc $rc: $(head -c 300 bad1.out)"
mpirun_t 60 2 train $COMMON --dp 2 --microbatches 3 --batch 9 > bad2.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "divisible by --dp 2 x --microbatches 3" bad2.out \
    && ok "a batch that does not split over the replicas is refused" || bad "batch split" "rc $rc: $(head -c 300 bad2.out)"

# a rank of replica 1 fails mid-step: every rank of both replicas ends, quickly, and it is named
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --dp 2 --microbatches 2 --fail-rank 3 --fail-step 2 --fail-at during --watchdog 20 \
    > fail.out 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -lt 45 ] && grep -q "rank 3" fail.out \
    && ok "a failing rank of one replica ends every rank in ${secs} s, named" \
    || bad "replica failure" "rc $rc after ${secs} s: $(grep -m3 -i 'error\|fail' fail.out | tr '\n' ' ')"

# bench: the unhidden reduction wait and the optimizer state per rank, halved by ZeRO-1
mpirun_t 120 2 bench --preset tiny --steps 2 --warmup 1 --batch 8 --seq-len 32 --microbatches 2 --dp 2 \
    --json b0.json > b0.out 2>&1 || bad "bench --dp 2" "exit $? $(tail -n 4 b0.out)"
mpirun_t 120 2 bench --preset tiny --steps 2 --warmup 1 --batch 8 --seq-len 32 --microbatches 2 --dp 2 --zero 1 \
    --json b1.json > b1.out 2>&1 || bad "bench --dp 2 --zero 1" "exit $? $(tail -n 4 b1.out)"
m0=$(sed 's/.*"optimizer_state_mb":\([0-9.]*\).*/\1/' b0.json)
m1=$(sed 's/.*"optimizer_state_mb":\([0-9.]*\).*/\1/' b1.json)
if grep -q '"dp":2' b0.json && grep -q '"dp_wait_ms"' b0.json && grep -q '"dp_pending_mb"' b0.json && \
   grep -q '"zero_gather_ms"' b1.json && grep -q "MB of gradients per step still reducing" b0.out && \
   awk -v a="$m0" -v b="$m1" 'BEGIN { exit !(a > 0 && b > 0.45 * a && b < 0.55 * a) }'; then
    ok "bench reports dp-wait and AdamW state: $m0 MB unsharded, $m1 MB with ZeRO-1"
else
    bad "bench dp figures" "unsharded '$m0' MB, ZeRO-1 '$m1' MB"
fi
finish
