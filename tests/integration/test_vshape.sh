#!/bin/bash
# test_vshape.sh — the V-shaped schedules (zb-v, dualpipev: two chunks per rank, stage s on
# rank s for s < P and on rank 2P-1-s after, so the first and last stage share rank 0) train
# bit-identically to one process on P = 2, 3, 4 with M = P..2P+1 (the plain tier: four of
# the 30 runs, both schedules on P = 2 and 3, an M below 2P and one above; the full tier all);
# the tied embedding's two copies on rank 0 stay identical; Llama (untied head) too; a
# checkpoint saved by a V-shaped run resumes into 1f1b, and one saved by 1f1b into zb-v,
# bit-identically; a V-shaped schedule's CSV trains the same bits. Every mpiexec runs under a
# timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --n-layer 6 --steps 3 --seq-len 16 --eval-every 0 --progress 0 --log-every 100"

# same NAME METRICS WEIGHTS REF: losses and final weights equal to reference REF's
same() {
    if cmp -s "$3" "$4.bin" && [ "$(losses "$2")" = "$(losses "$4.jsonl")" ] && [ -n "$(losses "$2")" ]; then
        ok "$1: losses and final weights bit-identical to one process"
    else
        bad "$1" "differs from the one-process run ($(losses "$2" | tr '\n' ' ') vs $(losses "$4.jsonl" | tr '\n' ' '))"
    fi
}
# ref M: the one-process run with M micro-batches of 2 sequences (made once)
ref() {
    [ -f ref$1.bin ] && return 0
    mpirun_t 120 1 train $C --batch $((2 * $1)) --microbatches $1 --metrics ref$1.jsonl --save-final ref$1.bin \
        > ref$1.out 2>&1 || bad "reference M=$1" "exit $?"
}
plain_case() { # P M SCHEDULE: the plain tier's four
    case "$1 $2 $3" in "2 3 zb-v" | "2 2 dualpipev" | "3 5 zb-v" | "3 7 dualpipev") return 0 ;; esac
    return 1
}
left=0
for P in 2 3 4; do
    for M in $(seq $P $((2 * P + 1))); do
        for S in zb-v dualpipev; do
            if ! full_tier && ! plain_case $P $M $S; then left=$((left + 1)); continue; fi
            ref $M
            f=v_${S}_${P}_$M
            if ! mpirun_t 180 $P train $C --batch $((2 * M)) --microbatches $M --schedule $S --metrics $f.jsonl \
                    --save-final $f.bin > $f.out 2>&1; then
                bad "$S P=$P M=$M" "exit $? ($(grep -m1 error $f.out))"
                continue
            fi
            same "$S P=$P M=$M" $f.jsonl $f.bin ref$M
            grep -q '"tied_identical":true' $f.jsonl || bad "$S P=$P M=$M" "tied embedding copies differ"
        done
    done
done
[ $left = 0 ] || full_only "$left more of the 30 P x M x schedule runs"

# the stage table: 2P stages, the last one (the head) on rank 0 beside the first
f=v_zb-v_3_5.out
grep -q "pipeline: 6 stages = 3 ranks x 2 chunks (V-shaped: stages r and 5-r on rank r)" $f &&
    grep -Eq "^ +5 +0 +[0-9-]+ +H " $f && grep -Eq "^ +3 +2 " $f && ok "stage table: stage 5 (the head) on rank 0, stage 3 on rank 2" \
    || bad "stage table" "$(grep -A8 '^pipeline' $f)"

# the CSV of a V-shaped schedule (no messages between rank P-1's stages) trains the same bits
"$PIPELM" schedule --stages 2 --microbatches 4 --schedule dualpipev --csv dpv.csv > /dev/null 2>&1
ref 4
if mpirun_t 120 2 train $C --batch 8 --microbatches 4 --schedule-csv dpv.csv --metrics csv.jsonl --save-final csv.bin \
        > csv.out 2>&1; then
    same "dualpipev from its CSV (P=2, 4 stages in a V)" csv.jsonl csv.bin ref4
else bad "V-shaped schedule CSV" "$(grep -m1 error csv.out)"; fi

# Llama: the untied head on rank 0's second chunk
L="--preset llama-tiny --n-layer 4 --steps 2 --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0"
mpirun_t 120 1 train $L --metrics lref.jsonl --save-final lref.bin > lref.out 2>&1 || bad "llama reference" "exit $?"
if mpirun_t 120 2 train $L --schedule zb-v --metrics l.jsonl --save-final l.bin > l.out 2>&1; then
    same "llama-tiny P=2 zb-v" l.jsonl l.bin lref
else bad "llama zb-v" "$(grep -m1 error l.out)"; fi

# checkpoints: V-shaped -> 1f1b and 1f1b -> V-shaped, against the straight run
N=4 K=2
R="--preset tiny --n-layer 6 --batch 8 --seq-len 16 --microbatches 4 --eval-every 0 --progress 0 --log-every 100"
mpirun_t 120 1 train $R --steps $N --metrics straight.jsonl --save-final straight.bin > straight.out 2>&1 || bad straight "exit $?"
resumed() { # NAME METRICS WEIGHTS
    if cmp -s straight.bin "$3" && [ "$(losses straight.jsonl | tail -n $((N - K)))" = "$(losses "$2")" ]; then
        ok "$1: steps $((K + 1))-$N and final weights bit-identical to the straight run"
    else bad "$1" "differs from the straight run ($(losses "$2" | tr '\n' ' '))"; fi
}
mpirun_t 120 2 train $R --steps $K --schedule zb-v --ckpt-dir cv --ckpt-every $K > cv.out 2>&1 \
    || bad "save on zb-v" "exit $? $(grep -m1 error cv.out)"
mpirun_t 120 2 train $R --steps $N --resume cv/ckpt_0000000$K.h5 --schedule 1f1b --metrics r1.jsonl --save-final r1.bin \
    > r1.out 2>&1 || bad "resume zb-v -> 1f1b" "exit $? $(grep -m1 error r1.out)"
resumed "zb-v (2 x 2 in a V) -> 1f1b on 2 ranks" r1.jsonl r1.bin
mpirun_t 120 2 train $R --steps $K --schedule 1f1b --ckpt-dir c1 --ckpt-every $K > c1.out 2>&1 \
    || bad "save on 1f1b" "exit $? $(grep -m1 error c1.out)"
mpirun_t 120 3 train $R --steps $N --resume c1/ckpt_0000000$K.h5 --schedule dualpipev --metrics r2.jsonl --save-final r2.bin \
    > r2.out 2>&1 || bad "resume 1f1b -> dualpipev" "exit $? $(grep -m1 error r2.out)"
resumed "1f1b on 2 ranks -> dualpipev on 3 (6 stages in a V)" r2.jsonl r2.bin

# refusals
mpirun_t 60 2 train $C --batch 8 --microbatches 4 --schedule zb-v --chunks-per-rank 3 > refuse.out 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "zb-v runs exactly 2 chunks per rank" refuse.out && ok "zb-v with 3 chunks per rank refused" \
    || bad "zb-v with 3 chunks" "rc=$rc $(head -c 300 refuse.out)"
finish
