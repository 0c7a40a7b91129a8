#!/bin/bash
# test_ckpt_lock.sh — one job at a time in a --ckpt-dir (DIR/.lock, docs/formats.md §2), and
# a save is verified before latest moves:
#   a. two runs started together on one directory: one runs, the other is refused naming the
#      owner's pid (exit 1); the survivor's checkpoint verifies and resumes;
#   b. a stale lock (a dead pid on this host) is taken over with a note;
#   c. a lock of another host is refused naming it (and how to remove it); a requeue of the
#      same Slurm job takes its own job's lock over;
#   d. no lock is left after a normal end, after exit 75 (SIGTERM) or after a failed save;
#   e. a run killed (SIGKILL) in a save leaves its lock and its temporary file (named after
#      rank 0's host and pid): a resume in the same directory takes both over and finishes;
#   f. a file corrupted after it is written (PIPELM_CKPT_FAIL=corrupt) is never named by
#      latest: the previous checkpoint stays latest and verifies; a failed save in a run that
#      is not resuming does not talk of resuming.
# Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --batch 4 --seq-len 16 --microbatches 2 --eval-every 0 --progress 0 --log-every 1000"
unset SLURM_JOB_ID SLURM_RESTART_COUNT
HOST=$(hostname | tr -c 'A-Za-z0-9._\n-' '_')

# ranks_of PID: the pipelm ranks below the mpiexec PID
ranks_of() { for p in $(descendants "$1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = pipelm ] && echo $p; done; }
# lock_file DIR HOST PID JOB RESTART: write a lock by hand
lock_file() {
    printf 'pipelm-ckpt-lock 1\nhost=%s\npid=%s\njob=%s\nrestart=%s\nstarted=2026-01-01T00:00:00Z\n' "$2" "$3" "$4" "$5" \
        > "$1/.lock"
}
# a pid that is no longer alive on this host
dead_pid() { sleep 0 & local p=$!; wait $p; echo $p; }

# ---- a. two runs together on one directory ------------------------------------------------
timeout -k 5 120 "$MPIEXEC" -n 2 "$PIPELM" train $C --steps 100000 --seed 1 --ckpt-dir two --ckpt-every 5 > a1.out 2>&1 &
p1=$!
timeout -k 5 120 "$MPIEXEC" -n 2 "$PIPELM" train $C --steps 100000 --seed 2 --ckpt-dir two --ckpt-every 5 > a2.out 2>&1 &
p2=$!
# the refused one ends at set-up; the other keeps running
for _ in $(seq 1 300); do { kill -0 $p1 2> /dev/null && kill -0 $p2 2> /dev/null; } || break; sleep 0.1; done
if ! kill -0 $p1 2> /dev/null; then loser=$p1 lout=a1.out winner=$p2 wout=a2.out; else loser=$p2 lout=a2.out winner=$p1 wout=a1.out; fi
wait $loser
lrc=$?
for _ in $(seq 1 100); do [ -f two/latest ] && break; sleep 0.1; done
owner=$(sed -n 's/^pid=//p' two/.lock 2> /dev/null)
wranks=$(ranks_of $winner)
if [ $lrc -eq 1 ] && [ -n "$owner" ] && grep -qw "$owner" <<< "$wranks" &&
    grep -q "rank 0: error: checkpoint directory two is in use by another job: host $HOST, pid $owner, job none" $lout &&
    grep -q "stopping all 2 ranks: rank 0 failed during set-up" $lout; then
    ok "two runs on one --ckpt-dir: the second is refused (exit 1) naming the owner, pid $owner"
else bad "two runs on one --ckpt-dir" "rc=$lrc owner='$owner' ranks='$wranks': $(grep error $lout | head -2)"; fi
kill -s TERM $wranks 2> /dev/null
wait $winner
wrc=$?
saved=$(cat two/latest 2> /dev/null)
if [ $wrc -eq 75 ] && [ -n "$saved" ] && "$PIPELM" inspect "two/$saved" > /dev/null 2>&1; then
    ok "the running one stops on SIGTERM (exit 75); its checkpoint $saved verifies"
else bad "the surviving run" "rc=$wrc latest='$saved' $(tail -n 2 $wout | tr '\n' ' ')"; fi
[ ! -e two/.lock ] && ok "no lock is left after exit 75" || bad "lock after exit 75" "$(cat two/.lock)"
n=${saved#ckpt_}
n=$((10#${n%.h5}))
mpirun_t 120 2 train $C --steps $((n + 2)) --seed $([ $winner = $p1 ] && echo 1 || echo 2) --ckpt-dir two --resume \
    > a3.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from two/$saved: step $n" a3.out && [ "$(cat two/latest)" = "$(printf 'ckpt_%08d.h5' $((n + 2)))" ] &&
    [ ! -e two/.lock ] && [ -z "$(ls -A two | grep tmp)" ]; then
    ok "the survivor resumes at step $((n + 1)) and finishes; no lock or temporary file left"
else bad "resume of the survivor" "rc=$rc $(grep -E 'error|resumed' a3.out | head -2)"; fi

# ---- b. a stale lock on this host --------------------------------------------------------
mkdir -p stale
dead=$(dead_pid)
lock_file stale "$HOST" "$dead" none 0
mpirun_t 60 2 train $C --steps 2 --ckpt-dir stale > b.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "rank 0: note: took over the stale lock stale/.lock of host $HOST, pid $dead, job none" b.out &&
    grep -q "pid $dead on this host ($HOST) no longer runs" b.out && [ "$(cat stale/latest)" = ckpt_00000002.h5 ]; then
    ok "a stale lock (pid $dead gone) is taken over with a note"
else bad "stale lock" "rc=$rc $(grep -E 'note|error' b.out | head -2)"; fi
[ ! -e stale/.lock ] && ok "no lock is left after a normal end" || bad "lock after a normal end" "$(cat stale/.lock)"
# a live process of this host holds it: refused
sleep 60 &
live=$!
lock_file stale "$HOST" $live none 0
mpirun_t 60 2 train $C --steps 2 --ckpt-dir stale > b2.out 2>&1
rc=$?
kill $live 2> /dev/null
if [ $rc -eq 1 ] && grep -q "checkpoint directory stale is in use by another job: host $HOST, pid $live" b2.out &&
    [ "$(sed -n 's/^pid=//p' stale/.lock)" = $live ]; then
    ok "a lock of a live pid on this host is refused and left alone"
else bad "live lock" "rc=$rc $(grep error b2.out | head -1)"; fi
rm -f stale/.lock

# ---- c. another host's lock; a requeue of the same Slurm job ------------------------------
mkdir -p other
lock_file other elsewhere.example 4321 987 0
mpirun_t 60 2 train $C --steps 2 --ckpt-dir other > c.out 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "in use by another job: host elsewhere.example, pid 4321, job 987" c.out &&
    grep -q "cannot tell whether that process is still alive" c.out && grep -q "rm other/.lock" c.out &&
    [ ! -e other/latest ]; then
    ok "another host's lock is refused naming the host, with how to remove it"
else bad "another host's lock" "rc=$rc $(grep error c.out | head -1)"; fi
SLURM_JOB_ID=987 SLURM_RESTART_COUNT=1 mpirun_t 60 2 train $C --steps 2 --ckpt-dir other > c2.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "note: took over the stale lock other/.lock of host elsewhere.example, pid 4321, job 987" c2.out &&
    grep -q "Slurm job 987, restart 0, is this job before its requeue (restart 1)" c2.out && [ ! -e other/.lock ]; then
    ok "a requeue of Slurm job 987 takes over its own job's lock from another host"
else bad "requeue takes over" "rc=$rc $(grep -E 'note|error' c2.out | head -2)"; fi
lock_file other elsewhere.example 4321 987 1
SLURM_JOB_ID=987 SLURM_RESTART_COUNT=1 mpirun_t 60 2 train $C --steps 2 --ckpt-dir other > c3.out 2>&1
[ $? -eq 1 ] && grep -q "host elsewhere.example, pid 4321, job 987" c3.out &&
    ok "the same Slurm job and restart on another host is refused (another step of the job may run)" ||
    bad "same job, same restart" "$(grep error c3.out | head -1)"

# ---- e. a run killed in a save; the resume takes over ------------------------------------
mpirun_t 60 2 train $C --steps 1 --ckpt-dir kill > e1.out 2>&1 || bad "first save" "exit $?"
PIPELM_CKPT_FAIL=kill:0 mpirun_t 60 2 train $C --steps 3 --ckpt-every 1 --ckpt-dir kill --resume > e2.out 2>&1
rc=$?
kpid=$(sed -n 's/^pid=//p' kill/.lock 2> /dev/null)
tmpf=$(cd kill && ls -A | grep '^\.ckpt_00000002\..*\.h5\.tmp$')
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -n "$kpid" ] && [ "$tmpf" = ".ckpt_00000002.$HOST.$kpid.h5.tmp" ] &&
    [ "$(cat kill/latest)" = ckpt_00000001.h5 ]; then
    ok "rank 0 killed in a save (rc $rc): lock and temporary file $tmpf left, latest still step 1"
else bad "killed in a save" "rc=$rc lock pid '$kpid', temp '$tmpf', $(ls -A kill | tr '\n' ' ')"; fi
mpirun_t 60 2 train $C --steps 3 --ckpt-every 1 --ckpt-dir kill --resume > e3.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "took over the stale lock kill/.lock of host $HOST, pid $kpid" e3.out &&
    grep -q "resumed from kill/ckpt_00000001.h5: step 1" e3.out && [ "$(cat kill/latest)" = ckpt_00000003.h5 ] &&
    [ ! -e kill/.lock ] && [ -z "$(ls -A kill | grep tmp)" ] && "$PIPELM" inspect kill/ckpt_00000003.h5 > /dev/null 2>&1; then
    ok "the killed run resumes in the same directory: stale lock and temporary file taken over, step 3 saved"
else bad "resume after SIGKILL" "rc=$rc $(grep -E 'note|error|resumed' e3.out | head -3) $(ls -A kill | tr '\n' ' ')"; fi

# ---- f. a corrupted file is never published ------------------------------------------------
mpirun_t 60 2 train $C --steps 1 --ckpt-dir bad > f1.out 2>&1 || bad "first save" "exit $?"
PIPELM_CKPT_FAIL=corrupt mpirun_t 60 2 train $C --steps 2 --ckpt-dir bad --resume > f2.out 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "rank 0: error: checkpoint at step 2: verifying the written file before publishing it: .*dataset /optim/v/lnf_b: CRC-32C mismatch" f2.out &&
    grep -q "bad/latest still names the previous checkpoint bad/ckpt_00000001.h5" f2.out &&
    [ "$(cat bad/latest)" = ckpt_00000001.h5 ] && [ ! -e bad/ckpt_00000002.h5 ] && [ -z "$(ls -A bad | grep tmp)" ] &&
    "$PIPELM" inspect bad/ckpt_00000001.h5 > /dev/null 2>&1; then
    ok "a file corrupted before publication: refused naming the dataset, latest still step 1, which verifies"
else bad "corrupted before publication" "rc=$rc $(grep error f2.out | head -3) $(ls -A bad | tr '\n' ' ')"; fi
[ ! -e bad/.lock ] && ok "no lock is left after a failed save" || bad "lock after a failed save" "$(cat bad/.lock)"
mpirun_t 60 2 train $C --steps 2 --ckpt-dir bad --resume > f3.out 2>&1 && grep -q "resumed from bad/ckpt_00000001.h5" f3.out &&
    [ "$(cat bad/latest)" = ckpt_00000002.h5 ] && ok "and it resumes" || bad "resume after the refused save" "$(grep error f3.out)"
# a run that is not resuming (told to start over: --ckpt-overwrite 1), with a checkpoint file
# but no latest: its failed save says so
rm bad/latest
PIPELM_CKPT_FAIL=corrupt mpirun_t 60 2 train $C --steps 2 --ckpt-dir bad --ckpt-overwrite 1 > f4.out 2>&1
rc=$?
if [ $rc -eq 1 ] && ! grep -q "resuming" f4.out && ! grep -q "intact" f4.out &&
    grep -q "checkpoint at step 2 failed; no earlier checkpoint is named by bad/latest (bad/latest is missing)" f4.out; then
    ok "a failed save in a run that is not resuming does not talk of resuming"
else bad "failure message without latest" "rc=$rc $(grep -E 'error|warning' f4.out | tail -2)"; fi

finish
