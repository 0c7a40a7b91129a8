#!/bin/bash
# test_elastic.sh — --dp auto / --stages auto (train_layout.c): a job resumed on another number
# of ranks picks its layout from what it has, printed with the reason, and continues from the
# checkpoint of the D x P = 2 x 2 run:
#   a. on 2 ranks: D x P = 2 x 1 (the most replicas that fit); D is kept, so steps 3-4 and the
#      final weights are bit-identical to the straight 2 x 2 run's;
#   b. on 2 ranks with little memory per rank (PIPELM_RANK_MEM_MB): 1 x 2, the 2 x 1 it passed
#      over named with the reason; D changed, so the losses agree within 1e-5 (relative);
#   c. on 1 rank: 1 x 1, within 1e-5;
#   d. no layout fits: refused (exit 2), naming each candidate and why;
#   e. jobs/train.sbatch (dry run) hands --dp auto --stages auto to pipelm as they are;
#   f. only layouts the schedule can run are chosen: zb-v on 4 ranks is 2 x 2 (4 x 1 passed
#      over by name), a 2 x 2 zb-v checkpoint resumes on 2 ranks as 1 x 2, with --stages auto
#      alone too, and the layout line names what was given.
# Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
C="--preset tiny --batch 8 --seq-len 16 --microbatches 2 --eval-every 0 --progress 0 --lr-schedule constant"
mpirun_t 120 4 train $C --dp 2 --stages 2 --steps 4 --save-final straight.bin --metrics st.jsonl > st.out 2>&1
mpirun_t 120 4 train $C --dp 2 --stages 2 --steps 2 --ckpt-dir ck > ck.out 2>&1
[ "$(cat ck/latest 2> /dev/null)" = ckpt_00000002.h5 ] || bad "the 2 x 2 run's checkpoint" "$(grep error ck.out | head -2)"

# a. 2 ranks: 2 x 1, bit-identical
cp -r ck a
mpirun_t 120 2 train $C --dp auto --stages auto --steps 4 --ckpt-dir a --resume --save-final a.bin --metrics a.jsonl \
    > a.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "layout: D x P = 2 x 1 on 2 ranks (--dp auto --stages auto): the most replicas whose stage fits" a.out &&
    grep -q "resumed from a/ckpt_00000002.h5: step 2 (saved on 2 stages" a.out && cmp -s straight.bin a.bin &&
    [ "$(losses st.jsonl | tail -n 2)" = "$(losses a.jsonl)" ]; then
    ok "2 x 2 -> 2 ranks, auto: 2 x 1; steps 3-4 and the final weights are bit-identical (D kept)"
else bad "2 x 2 -> 2 ranks, auto" "rc=$rc $(grep -E 'layout: D|error' a.out | head -2)"; fi

# b. 2 ranks with 3 MB each: 1 x 2, within 1e-5
cp -r ck b
PIPELM_RANK_MEM_MB=3 mpirun_t 120 2 train $C --dp auto --stages auto --steps 4 --ckpt-dir b --resume --metrics b.jsonl \
    > b.out 2>&1
rc=$?
losses st.jsonl | tail -n 2 > st34
if [ $rc -eq 0 ] && grep -q "layout: D x P = 1 x 2 on 2 ranks .*passed over; 2 x 1: a stage needs about [0-9]* MB, more than the 3 MB of a rank" b.out &&
    paste st34 <(losses b.jsonl) | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) exit 1 }' &&
    [ "$(losses b.jsonl | wc -l)" = 2 ]; then
    ok "2 x 2 -> 2 ranks of 3 MB, auto: 1 x 2 (2 x 1 passed over: memory); steps 3-4 within 1e-5"
else bad "2 x 2 -> 2 ranks of 3 MB" "rc=$rc $(grep -E 'layout: D|error' b.out | head -2)"; fi

# c. 1 rank: 1 x 1, within 1e-5
cp -r ck c
mpirun_t 120 1 train $C --dp auto --stages auto --steps 4 --ckpt-dir c --resume --metrics c.jsonl > c.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "layout: D x P = 1 x 1 on 1 rank " c.out &&
    paste st34 <(losses c.jsonl) | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) exit 1 }'; then
    ok "2 x 2 -> 1 rank, auto: 1 x 1; steps 3-4 within 1e-5"
else bad "2 x 2 -> 1 rank" "rc=$rc $(grep -E 'layout: D|error' c.out | head -2)"; fi

# d. nothing fits
PIPELM_RANK_MEM_MB=1 expect "no layout fits: refused naming each candidate" 2 \
    "rank 0: error: --dp auto --stages auto: no layout of 2 ranks fits; 2 x 1: a stage needs about .*; 1 x 2: a stage needs about" \
    mpirun_t 60 2 train $C --dp auto --stages auto --steps 2
expect "--dp auto with --stages given: the other follows" 0 "layout: D x P = 1 x 2 on 2 ranks (--dp auto --stages 2)" \
    mpirun_t 60 2 train $C --dp auto --stages 2 --steps 1

# f. only layouts the schedule runs (issue 37, item 6): zb-v's 2 chunks need 2 pipeline ranks
expect "zb-v on 4 ranks, auto: 2 x 2, the 4 x 1 it passed over named" 0 \
    "layout: D x P = 2 x 2 on 4 ranks (--dp auto --stages auto).*--schedule zb-v runs (2 chunks a rank.*passed over; 4 x 1: --schedule zb-v runs 2 chunks per rank, which needs at least 2 pipeline ranks" \
    mpirun_t 120 4 train $C --dp auto --stages auto --schedule zb-v --steps 1
mpirun_t 120 4 train $C --dp 2 --stages 2 --schedule zb-v --steps 2 --ckpt-dir vk > vk.out 2>&1 || bad "zb-v 2 x 2" "$(grep error vk.out)"
for S in "--dp auto --stages auto" "--stages auto"; do
    mpirun_t 120 2 train $C $S --schedule zb-v --steps 3 --ckpt-dir vk --resume --ckpt-every 0 > v.out 2>&1; rc=$?
    want="(--dp auto --stages auto)"; [ "$S" = "--stages auto" ] && want="(--dp not given --stages auto)"
    if [ $rc -eq 0 ] && grep -qF "layout: D x P = 1 x 2 on 2 ranks $want" v.out && grep -q "resumed from vk/ckpt_00000002.h5" v.out; then
        ok "a 2 x 2 zb-v checkpoint on 2 ranks, $S: 1 x 2 (2 x 1 cannot run zb-v), the layout line says $want"
    else bad "zb-v resume $S" "rc=$rc $(grep -E 'layout: D|error' v.out | head -2)"; fi
    rm -f vk/ckpt_00000003.h5; echo ckpt_00000002.h5 > vk/latest
done

# e. the job script passes auto through
out=$(PIPELM_DRY_RUN=1 PIPELM_NTASKS=2 PIPELM_NNODES=1 PIPELM_RUNS=$WORK/runs PIPELM=$PIPELM bash "$TOP/jobs/train.sbatch" \
    $C --dp auto --stages auto 2>&1)
if grep -q "layout chosen by pipelm" <<< "$out" && grep -q "^+ srun .* train .*--dp auto --stages auto" <<< "$out"; then
    ok "train.sbatch hands --dp auto --stages auto to pipelm"
else bad "train.sbatch with auto" "$(printf '%s' "$out" | tail -n 3)"; fi
finish
