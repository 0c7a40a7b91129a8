#!/bin/bash
# test_ckpt_back.sh — a checkpoint directory is never moved backwards (issue 37, item 4): a
# run that does not resume into a --ckpt-dir holding checkpoints is refused by name (exit 2),
# the directory byte-for-byte unchanged, latest where it was; --ckpt-overwrite 1 starts over
# and --ckpt-keep then removes only what that run wrote; a run resumed from an older
# checkpoint keeps (and does not count) the newer ones it did not write, and removes those it
# wrote again or that are older than the one it resumed from; --fail-at stall under
# --ckpt-async 1 hangs the writer and the watchdog ends the job.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0 --log-every 100"
mpirun_t 120 1 train $C --steps 12 --ckpt-dir ek --ckpt-every 6 > a.out 2>&1 || bad "train" "exit $?"
snap() { (cd ek && md5sum ckpt_*.h5 latest); }
before=$(snap)
for np in 1 2; do
    mpirun_t 60 $np train $C --steps 7 --ckpt-dir ek --ckpt-every 6 --ckpt-keep 1 > o.out 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "rank 0: error: --ckpt-dir ek holds checkpoints (the newest: step 12)" o.out &&
        [ "$(grep -c error o.out)" = 1 ] && [ "$(snap)" = "$before" ]; then
        ok "not resuming into a directory with checkpoints ($np ranks): refused once by name, nothing touched"
    else bad "refusal np=$np" "rc=$rc $(grep -m2 error o.out)"; fi
done
printf 'steps = 7\nckpt-dir = ek\nckpt-every = 6\nckpt-keep = 1\n' > c.ini
mpirun_t 60 1 train $C --config c.ini > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "holds checkpoints" o.out && [ "$(snap)" = "$before" ]; then ok "the same from a config file: refused"
else bad "config" "rc=$rc $(grep -m1 error o.out)"; fi
# start over explicitly: its own checkpoints 5, 10, 13 are pruned to the newest; 6 and 12 (not
# its own) are kept, and not counted against --ckpt-keep
cp -r ek ek2
mpirun_t 60 1 train $C --steps 13 --ckpt-dir ek2 --ckpt-every 5 --ckpt-keep 1 --ckpt-overwrite 1 > o.out 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(ls ek2 | tr '\n' ' ')" = "ckpt_00000006.h5 ckpt_00000012.h5 ckpt_00000013.h5 latest " ] &&
    cmp -s ek/ckpt_00000012.h5 ek2/ckpt_00000012.h5 && cmp -s ek/ckpt_00000006.h5 ek2/ckpt_00000006.h5 &&
    [ "$(cat ek2/latest)" = ckpt_00000013.h5 ]; then
    ok "--ckpt-overwrite 1: starts over, --ckpt-keep removes only its own checkpoints (6 and 12 kept as they were)"
else bad "--ckpt-overwrite" "rc=$rc $(ls ek2 | tr '\n' ' ') $(grep -m1 error o.out)"; fi
# resumed from an older checkpoint: 9 and 12 (newer, not written by this run) are neither
# removed nor counted; its own 7 and the older 3 and 6 are
mpirun_t 120 1 train $C --steps 12 --ckpt-dir ek3 --ckpt-every 3 > o.out 2>&1
mpirun_t 60 1 train $C --steps 14 --ckpt-dir ek3 --ckpt-every 7 --ckpt-keep 1 --resume ek3/ckpt_00000006.h5 > o.out 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(ls ek3 | tr '\n' ' ')" = "ckpt_00000009.h5 ckpt_00000012.h5 ckpt_00000014.h5 latest " ]; then
    ok "resumed from 6 with --ckpt-keep 1: its own 7 and the older 3, 6 pruned, the newer 9, 12 kept"
else bad "keep after resume" "rc=$rc $(ls ek3 | tr '\n' ' ')"; fi
mpirun_t 60 1 train $C --steps 7 --ckpt-dir ek --ckpt-every 6 --resume > o.out 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from ek/ckpt_00000012.h5" o.out; then ok "resuming in the same directory is allowed"
else bad "resume" "rc=$rc $(grep -m1 error o.out)"; fi
# --fail-at stall with --ckpt-async 1 (issue 37, item 9): it used to be ignored (exit 0); now
# the rank's writer hangs inside the save and the watchdog over the async save ends the job
expect "--fail-at stall under --ckpt-async 1: the writer's watchdog ends the job by name" 1 \
    "rank 1: error: watchdog: the checkpoint writer of step 2 has been writing for" \
    mpirun_t 90 2 train $C --steps 100000 --ckpt-every 2 --ckpt-dir st --ckpt-async 1 --watchdog 1 --fail-rank 1 \
    --fail-step 2 --fail-at stall
finish
