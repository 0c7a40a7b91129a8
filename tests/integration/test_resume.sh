#!/bin/bash
# test_resume.sh — exact resume and resharding through checkpoints, and preemption:
# N steps straight == k steps + checkpoint + resume + N-k steps, bit for bit, whether the
# resumed run has the same, fewer or more stages; SIGUSR1 / SIGTERM make every rank finish
# its step, save, and exit 75. Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --batch 8 --seq-len 32 --microbatches 4 --eval-every 0 --progress 0 --log-every 100"
N=8
K=4

mpirun_t 120 1 train $C --steps $N --metrics straight.jsonl --save-final straight.bin > straight.out 2>&1 \
    || bad "straight run" "exit $?"

# same_as_straight NAME METRICS WEIGHTS: the resumed steps' losses and the final weights match
same_as_straight() {
    if cmp -s straight.bin "$3" && [ "$(losses straight.jsonl | tail -n $((N - K)))" = "$(losses "$2")" ]; then
        ok "$1: losses of steps $((K + 1))-$N and final weights bit-identical to the straight run"
    else
        bad "$1" "differs from the straight run"
    fi
}

# save on 4 stages at step K, resume on 2, on 1 and on 4
mpirun_t 300 4 train $C --steps $K --ckpt-dir c4 --ckpt-every $K > c4.out 2>&1 || bad "save on 4 stages" "exit $?"
[ -f c4/latest ] && ok "4-stage run left a checkpoint: $(cat c4/latest)" || bad "4-stage checkpoint" "no latest"
for P in 2 1 4; do
    mpirun_t 300 $P train $C --steps $N --resume c4/ckpt_0000000$K.h5 --metrics r4to$P.jsonl \
        --save-final r4to$P.bin > r4to$P.out 2>&1 || bad "resume 4 -> $P" "exit $? $(grep -m1 error r4to$P.out)"
    grep -q "resumed from .*step $K (saved on 4 stages" r4to$P.out && same_as_straight "4 -> $P stages" r4to$P.jsonl r4to$P.bin \
        || bad "resume 4 -> $P" "no resume line"
done

# save on 1 stage, resume on 4 (bare --resume: the newest checkpoint in --ckpt-dir)
mpirun_t 120 1 train $C --steps $K --ckpt-dir c1 --ckpt-every 2 --ckpt-keep 1 > c1.out 2>&1 || bad "save on 1 stage" "exit $?"
[ "$(ls c1/*.h5 | wc -l)" -eq 1 ] && ok "--ckpt-keep 1 keeps one file" || bad "--ckpt-keep" "$(ls c1)"
mpirun_t 300 4 train $C --steps $N --ckpt-dir c1 --resume --metrics r1to4.jsonl --save-final r1to4.bin > r1to4.out 2>&1 \
    || bad "resume 1 -> 4" "exit $?"
same_as_straight "1 -> 4 stages" r1to4.jsonl r1to4.bin

# a checkpoint from another model is refused, naming the setting and both values
mpirun_t 60 1 train $C --n-embd 32 --steps $N --resume c4/ckpt_0000000$K.h5 > bad.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "n_embd.*64.*32\|n-embd.*64.*32\|n_embd.*32.*64" bad.out; then
    ok "config mismatch refused: $(grep -m1 error bad.out | cut -c1-150)"; else bad "config mismatch" "rc=$rc $(head -c 300 bad.out)"; fi


# preemption: a signal mid-run -> the step finishes, every rank saves, exit 75; resume completes.
# SIGUSR1 goes to one rank only (the others learn of it in the step's allreduce), SIGTERM to all.
for SIG in USR1 TERM; do
    rm -rf pre pre.jsonl
    timeout -k 5 120 "$MPIEXEC" -n 2 "$PIPELM" train $C --steps 400 --ckpt-dir pre --metrics pre.jsonl > pre.out 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do grep -q '"event":"step","step":3,' pre.jsonl 2>/dev/null && break; sleep 0.1; done
    ranks=$(for p in $(descendants $pid); do [ "$(cat /proc/$p/comm 2>/dev/null)" = pipelm ] && echo $p; done)
    if [ $SIG = USR1 ]; then kill -s $SIG $(echo $ranks | cut -d' ' -f2); else kill -s $SIG $ranks; fi
    wait $pid
    rc=$?
    saved=$(cat pre/latest 2>/dev/null)
    if [ $rc -eq 75 ] && [ -n "$saved" ] && grep -q "received SIG$SIG: stopping after step" pre.out; then
        ok "SIG$SIG: exit 75 with checkpoint $saved"
    else
        bad "SIG$SIG preemption" "rc=$rc latest='$saved' $(tail -n 3 pre.out | tr '\n' ' ')"
    fi
done
mpirun_t 300 2 train $C --steps 400 --ckpt-dir pre --resume --metrics post.jsonl > post.out 2>&1
rc=$?
step=$(grep '"event":"step"' post.jsonl | head -n 1 | sed 's/.*"step":\([0-9]*\),.*/\1/')
n=${saved#ckpt_}
n=${n%.h5}
if [ $rc -eq 0 ] && [ "$step" = "$((10#$n + 1))" ] && grep -q '"event":"end","steps":400' post.jsonl; then
    ok "resumed after preemption at step $step and finished 400 steps"
else
    bad "resume after preemption" "rc=$rc first step $step after $saved"
fi

finish
