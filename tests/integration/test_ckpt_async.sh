#!/bin/bash
# test_ckpt_async.sh — --ckpt-async (issue 27), every mpiexec under a timeout:
#   a. an async save is the synchronous save of the same step (every dataset's bytes, every
#      crc32c, every attribute but /created and /meta_crc32c; tests/reference/ckpt_same.py with h5py)
#      on 1, 2 and 4 ranks (4: D x P = 2 x 2 with ZeRO-1), verifies (pipelm inspect), and
#      every save writes its "ckpt" metrics line;
#   b. a run resumed from an async checkpoint continues bit-identically (losses and final
#      weights of the straight run);
#   c. a writer failure on one rank, before, during and after its data and during publish
#      (PIPELM_CKPT_FAIL before:1, write:1, after:1, rename): every rank stops non-zero naming
#      it, and the previous checkpoint stays latest and verifies;
#   d. SIGTERM while a write is in flight (PIPELM_CKPT_FAIL=delay slows it): the write
#      completes, exit 75, and the resume continues bit-identically;
#   e. refusals: MPI without MPI_THREAD_MULTIPLE (PIPELM_MPI_THREAD=serialized), a snapshot
#      that does not fit (PIPELM_CKPT_ASYNC_MEM_MB); the watchdog ends a writer that hangs.
. "$(dirname "$0")/../lib/lib.sh"
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$WORK"
PY=/usr/bin/python3
SAME="$PY $TOP/tests/reference/ckpt_same.py"
C="--preset tiny --batch 8 --seq-len 16 --microbatches 2 --eval-every 0 --progress 0 --lr-schedule constant"
unset SLURM_JOB_ID SLURM_RESTART_COUNT PIPELM_CKPT_FAIL
have_h5py=1
$PY -c 'import h5py, numpy' 2> /dev/null || have_h5py=0

# same NAME A B: the two files are the same save
same() {
    local out
    if [ $have_h5py = 0 ]; then bad "$1" "$PY cannot import h5py and numpy (./jobs/setup.sh --test installs them)"; return 1; fi
    if out=$($SAME "$2" "$3" 2>&1) && "$PIPELM" inspect "$3" > /dev/null 2>&1; then ok "$1"
    else bad "$1" "$(printf '%s' "$out" | head -c 400)"; fi
}
# pid_of RANK: the pid of a rank of the background job $job
pid_of() {
    local p
    for p in $(descendants "$job"); do
        [ "$(cat /proc/$p/comm 2> /dev/null)" = pipelm ] || continue
        tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx "PMI_RANK=$1" && { echo $p; return; }
    done
}
# wait_for FILE PATTERN SECONDS
wait_for() {
    for _ in $(seq 1 $(($3 * 10))); do grep -q -- "$2" "$1" 2> /dev/null && return 0; sleep 0.1; done
    return 1
}

# ---- a. the same file as a synchronous save, on 1, 2 and 4 ranks -------------------------
# (1 and 2 ranks in the full tier: the plain tier keeps 4 as D x P = 2 x 2 with ZeRO-1, which
# has both a stage boundary and sharded moments)
nps="4"
if full_tier; then nps="1 2 4"; else full_only "an async save is the sync save on 1 and 2 ranks"; fi
for np in $nps; do
    x=""
    [ $np = 4 ] && x="--dp 2 --zero 1"
    mpirun_t 120 $np train $C $x --steps 4 --ckpt-every 2 --ckpt-dir s$np --metrics s$np.jsonl > s$np.out 2>&1
    r1=$?
    # (the writer's MPI-IO writes in pieces of 1000 bytes, not 4 MiB: every dataset of this model
    # is written in several)
    PIPELM_CKPT_ASYNC_PIECE=1000 mpirun_t 120 $np train $C $x --steps 4 --ckpt-every 2 --ckpt-dir a$np --ckpt-async 1 \
        --metrics a$np.jsonl > a$np.out 2>&1
    r2=$?
    if [ $r1 -ne 0 ] || [ $r2 -ne 0 ]; then
        bad "async save on $np rank(s)" "rc $r1/$r2: $(grep error s$np.out a$np.out | head -2)"
        continue
    fi
    same "an async save is the sync save (step 2, $np rank(s)${x:+, $x})" s$np/ckpt_00000002.h5 a$np/ckpt_00000002.h5
    same "an async save is the sync save (step 4, $np rank(s))" s$np/ckpt_00000004.h5 a$np/ckpt_00000004.h5
    if [ "$(losses s$np.jsonl)" = "$(losses a$np.jsonl)" ] && [ "$(cat a$np/latest)" = ckpt_00000004.h5 ] &&
        [ "$(grep -c '"event":"ckpt","step":[24],"bytes":[1-9][0-9]*,"blocked_ms":[0-9.]*,"write_ms":[0-9.]*,"mode":"async"' a$np.jsonl)" = 2 ] &&
        [ "$(grep -c '"event":"ckpt",.*"mode":"sync"' s$np.jsonl)" = 2 ] &&
        grep -q "checkpoints: --ckpt-async: a host snapshot of at most [0-9.]* MB per rank" a$np.out; then
        ok "$np rank(s): the same losses, latest moved, a ckpt metrics line per save, the snapshot in the banner"
    else bad "$np rank(s): losses / latest / metrics" "$(grep '"ckpt"' a$np.jsonl s$np.jsonl | head -4)"; fi
done

# the copy into the snapshot left to the writer (no ZeRO-1): made 400 ms late on purpose
# (PIPELM_CKPT_ASYNC_COPY_DELAY_MS), the next step's optimizer waits for it (fence_ms), and the
# file is still the synchronous save's, the values of the saved step
mpirun_t 120 2 train $C --steps 4 --ckpt-every 2 --ckpt-dir fs > fs.out 2>&1
r1=$?
PIPELM_CKPT_ASYNC_COPY_DELAY_MS=400 mpirun_t 120 2 train $C --steps 4 --ckpt-every 2 --ckpt-dir fa --ckpt-async 1 \
    --metrics fa.jsonl > fa.out 2>&1
r2=$?
fence=$(sed -n 's/.*"event":"ckpt","step":2,.*"fence_ms":\([0-9.]*\).*/\1/p' fa.jsonl)
if [ $r1 = 0 ] && [ $r2 = 0 ] && [ -n "$fence" ] && awk -v f="$fence" 'BEGIN { exit !(f > 100) }'; then
    same "a deferred snapshot copied 400 ms late: the optimizer waited ${fence} ms for it; the file is the sync save's" \
        fs/ckpt_00000002.h5 fa/ckpt_00000002.h5
else bad "deferred snapshot" "rc $r1/$r2, fence_ms '$fence': $(grep '"ckpt"' fa.jsonl | head -2)"; fi

# ---- b. a resume from an async checkpoint is bit-identical ---------------------------------
mpirun_t 120 2 train $C --steps 6 --save-final straight.bin --metrics st.jsonl > st.out 2>&1
mpirun_t 120 2 train $C --steps 6 --ckpt-every 2 --ckpt-dir r --ckpt-async 1 > r1.out 2>&1
rm -f r/ckpt_00000006.h5 r/ckpt_00000004.h5 r/latest
mpirun_t 120 2 train $C --steps 6 --ckpt-dir r --ckpt-async 1 --resume --save-final resumed.bin --metrics re.jsonl \
    > r2.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from r/ckpt_00000002.h5" r2.out && cmp -s straight.bin resumed.bin &&
    [ "$(losses st.jsonl | tail -n 4)" = "$(losses re.jsonl)" ]; then
    ok "resumed from an async checkpoint of step 2: steps 3-6 and the final weights are bit-identical"
else bad "resume from an async checkpoint" "rc=$rc $(grep -E 'error|resumed' r2.out | head -2)"; fi

# ---- c. a writer failure on one rank ---------------------------------------------------------
mpirun_t 120 2 train $C --steps 2 --ckpt-dir f0 > f0.out 2>&1 # the previous checkpoint: step 2
# (before:1 and after:1 in the full tier: the plain tier keeps a failure during the data and one
# during publish)
modes="write:1 rename"
if full_tier; then modes="before:1 write:1 after:1 rename"; else full_only "PIPELM_CKPT_FAIL=before:1, after:1 in the writer"; fi
for mode in $modes; do
    d=f_${mode%%:*}
    rm -rf $d && cp -r f0 $d
    PIPELM_CKPT_FAIL=$mode mpirun_t 120 2 train $C --steps 40 --ckpt-every 4 --ckpt-dir $d --ckpt-async 1 --resume \
        > $d.out 2>&1
    rc=$?
    who=1
    [ $mode = rename ] && who=0
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(cat $d/latest)" = ckpt_00000002.h5 ] &&
        "$PIPELM" inspect $d/ckpt_00000002.h5 > /dev/null 2>&1 && [ ! -e $d/ckpt_00000004.h5 ] &&
        grep -q "rank 0: error: checkpoint at step 4 (written in the background): .*rank $who: .*PIPELM_CKPT_FAIL=${mode%%:*}" $d.out &&
        grep -q "rank 1: error: checkpoint at step 4 (written in the background): .*rank $who: .*PIPELM_CKPT_FAIL=${mode%%:*}" $d.out &&
        grep -q "latest still names the previous checkpoint" $d.out && ! grep -q "^step *40 " $d.out &&
        [ -z "$(ls -A $d | grep tmp)" ]; then
        ok "PIPELM_CKPT_FAIL=$mode in the writer: both ranks stop (exit $rc) naming rank $who; ckpt_00000002.h5 stays latest and verifies"
    else bad "PIPELM_CKPT_FAIL=$mode in the writer" "rc=$rc latest=$(cat $d/latest) $(grep error $d.out | head -3)"; fi
done

# ---- d. SIGTERM while a write is in flight ---------------------------------------------------
timeout -k 5 120 "$MPIEXEC" -n 2 env PIPELM_CKPT_FAIL=delay:1 "$PIPELM" train $C --steps 100000 --ckpt-every 3 \
    --ckpt-dir sig --ckpt-async 1 --metrics sig.jsonl > sig.out 2>&1 &
job=$!
wait_for sig.jsonl '"step":4,' 60 # the save of step 3 is being written (rank 1 waits 1 s in it)
kill -TERM "$(pid_of 1)" 2> /dev/null
timeout 60 tail --pid=$job -f /dev/null
wait $job
rc=$?
last=$(cat sig/latest 2> /dev/null)
n=${last#ckpt_}
n=$((10#${n%.h5}))
# the write in flight when the stop came (each takes 1 s or more, a save is due every 3 steps of ~0.05 s)
m=$(sed -n "s/.*checkpoint at step $n waited [0-9.]* s for the write of step \([0-9]*\) to finish.*/\1/p" sig.out)
if [ $rc -eq 75 ] && grep -q "rank 1 received SIGTERM: stopping after step $n (checkpoint saved)" sig.out &&
    [ -n "$m" ] && grep -q "checkpoint sig/ckpt_$(printf %08d "$m").h5: step $m, .* written in the background" sig.out &&
    "$PIPELM" inspect "sig/ckpt_$(printf %08d "$m").h5" > /dev/null 2>&1 && "$PIPELM" inspect "sig/$last" > /dev/null 2>&1; then
    ok "SIGTERM during the write of step $m: it completes, step $n is saved too, exit 75"
else bad "SIGTERM during an async write" "rc=$rc latest=$last $(grep -E 'error|received|waited' sig.out | head -3)"; fi
if [ $n -gt 3 ] 2> /dev/null; then
    mpirun_t 120 2 train $C --steps $((n + 2)) --ckpt-dir sig --ckpt-async 1 --resume --metrics sig2.jsonl > sig2.out 2>&1
    r1=$?
    mpirun_t 120 2 train $C --steps $((n + 2)) --metrics sigs.jsonl > sigs.out 2>&1
    if [ $r1 -eq 0 ] && [ "$( (losses sig.jsonl | head -n $n; losses sig2.jsonl) )" = "$(losses sigs.jsonl)" ]; then
        ok "the resume after SIGTERM continues bit-identically (steps 1-$((n + 2)) equal the straight run's)"
    else bad "resume after SIGTERM" "rc=$r1 $(grep -E 'error|resumed' sig2.out | head -2)"; fi
fi

# ---- e. refusals and the watchdog --------------------------------------------------------------
PIPELM_MPI_THREAD=serialized expect "--ckpt-async refused without MPI_THREAD_MULTIPLE" 2 \
    "rank 0: error: --ckpt-async needs MPI_THREAD_MULTIPLE .* the MPI library gave MPI_THREAD_SERIALIZED" \
    mpirun_t 60 2 train $C --steps 2 --ckpt-dir e1 --ckpt-async 1
PIPELM_CKPT_ASYNC_MEM_MB=2 expect "--ckpt-async refused when the snapshot does not fit" 1 \
    "error: --ckpt-async: the checkpoint snapshot of this rank needs [0-9.]* MB of host memory, but only 1.0 MB" \
    mpirun_t 60 2 train $C --steps 2 --ckpt-dir e2 --ckpt-async 1
PIPELM_MPI_THREAD=serialized expect "no --ckpt-async: a lower thread level is fine" 0 "done: 2 steps" \
    mpirun_t 60 2 train $C --steps 2 --ckpt-dir e3
t0=$(date +%s)
PIPELM_CKPT_FAIL=stall:1 expect "a writer that hangs on one rank: the watchdog ends the job" 1 \
    "rank 1: error: watchdog: the checkpoint writer of step 2 has been writing for" \
    mpirun_t 90 2 train $C --steps 100000 --ckpt-every 2 --ckpt-dir e4 --ckpt-async 1 --watchdog 1
[ "$(cat e4/latest 2> /dev/null)" = "" ] && ok "... and publishes nothing" || bad "stalled writer" "latest $(cat e4/latest)"
finish
