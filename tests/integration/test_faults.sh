#!/bin/bash
# No failure may hang a job: injected failures before, during and after a step and as a save
# starts, with and without --trace, --metrics, --timers-every and checkpoints; a NaN named at
# its source; SIGINT/SIGTERM/SIGUSR1 (first: clean stop, second: at once); the watchdog
# against a rank stopped with SIGSTOP; the back-off while waiting; a rank killed with -9.
# Every run is under a timeout: a hang fails the check instead of blocking CI.
source "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
COMMON="--preset tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0"

# pids_of RANK: the pid of that rank of the job whose command line holds this test's $WORK
pid_of() {
    local want=$1 p
    for p in $(pgrep -f "pipelm train.*$WORK"); do
        if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "PMI_RANK=$want"; then echo $p; return; fi
    done
}
# wait_for FILE PATTERN SECONDS: until FILE holds PATTERN
wait_for() {
    local i
    for i in $(seq 1 $((10 * $3))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
# elapsed since START (seconds, integer)
since() { echo $(($(date +%s) - $1)); }

# 1. injected failures: every point, plain and with every collective-using option
for at in before during after save; do
    for extra in plain full; do
        # the full tier only: the collective-using options at every point but the save (read below)
        if [ $extra = full ] && [ $at != save ] && ! full_tier; then full_only "failure $at step 3 (full)"; continue; fi
        opts="--steps 6 --fail-rank 1 --fail-step 3 --fail-at $at --ckpt-dir $WORK/ck_${at}_${extra}"
        [ $at = save ] && opts="$opts --ckpt-every 1"
        [ $extra = full ] && opts="$opts --trace $WORK/t.json --metrics $WORK/m_$at.jsonl --timers-every 1"
        t0=$(date +%s)
        mpirun_t 60 3 train $COMMON $opts > f.out 2> f.err
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && grep -q "rank 1: error: injected failure" f.err &&
            [ "$(since $t0)" -le 20 ]; then
            ok "failure $at step 3 ($extra): rc $rc in $(since $t0) s, rank 1 named"
        else bad "failure $at step 3 ($extra)" "rc=$rc after $(since $t0) s: $(tail -n 3 f.err)"; fi
    done
done
# the first checkpoint survives a failure as the next save starts
if [ "$(cat "$WORK/ck_save_full/latest" 2>/dev/null)" = ckpt_00000002.h5 ] &&
    "$PIPELM" inspect "$WORK/ck_save_full/ckpt_00000002.h5" > /dev/null 2>&1; then
    ok "a failure as a save starts leaves the previous checkpoint, which verifies"
else bad "previous checkpoint after a failed save" "$(ls "$WORK/ck_save_full" 2>&1)"; fi
# set-up failure, and a failure on the last rank mid-step
mpirun_t 60 3 train $COMMON --steps 3 --fail-rank 2 --fail-step 0 > f.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 2 failed during set-up" f.out; then ok "set-up failure on rank 2 named"
else bad "set-up failure" "rc=$rc $(tail -n 2 f.out)"; fi
mpirun_t 60 3 train $COMMON --steps 3 --fail-rank 5 > f.out 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "fail-rank 5 is not a rank" f.out; then ok "--fail-rank beyond the job refused"
else bad "--fail-rank beyond the job" "rc=$rc $(tail -n 2 f.out)"; fi

# 2. a NaN planted in stage 1's weights is named there, not in the embeddings
mpirun_t 60 3 train $COMMON --steps 4 --fail-rank 1 --fail-step 2 --fail-at nan > f.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "weights of stage 1 (rank 1) already hold a non-finite value, first in h\." f.out; then
    ok "NaN named at its stage: $(grep -m1 'weights of stage' f.out | cut -c1-150)"
else bad "NaN source" "rc=$rc $(grep error f.out | head -3)"; fi

# 3. signals
# a long run, bounded: a check that fails to stop it cannot hold up the suite
long() { timeout -k 5 150 "$MPIEXEC" -n 3 "$PIPELM" train $COMMON --steps 100000 --metrics "$WORK/long.jsonl" "$@"; }
# start_long OUT ARGS...: a long run in the background ($job), once it has done 3 steps
start_long() {
    local out=$1
    shift
    rm -f long.jsonl
    long "$@" > "$out" 2>&1 &
    job=$!
    wait_for long.jsonl '"step":3,' 90
}
# end_long SECONDS: wait (at most SECONDS) for the background run; its status in $rc
end_long() {
    timeout "$1" tail --pid=$job -f /dev/null
    wait $job
    rc=$?
}
for sig in INT TERM; do
    start_long s.out --ckpt-dir "$WORK/ck_sig$sig"
    p=$(pid_of 1)
    kill -$sig "$p"
    t0=$(date +%s)
    end_long 60
    if [ $rc -eq 75 ] && grep -q "rank 1 received SIG$sig: stopping after step" s.out && ls ck_sig$sig/*.h5 >/dev/null 2>&1; then
        ok "SIG$sig to rank 1: clean stop with a checkpoint, exit 75 in $(since $t0) s"
    else bad "SIG$sig to rank 1" "rc=$rc $(grep -E 'error|received|Segm' s.out | head -3)"; fi
done
# Ctrl-C at the terminal: SIGINT to mpiexec, which forwards it to every rank
start_long s.out
kill -INT "$(pgrep -f "^$MPIEXEC -n 3 .*$WORK" | head -n 1)"
end_long 60
# (every rank exits 75; hydra's own status after it forwarded a SIGINT was 75 in most runs and
# 0 in one: the ranks' clean stop is what is checked, through the end line of the metrics)
if { [ $rc -eq 75 ] || [ $rc -eq 0 ]; } && grep -q "received SIGINT: stopping after step" s.out &&
    grep -q '"event":"end".*"preempted":true' long.jsonl && ! grep -qi "segmentation" s.out; then
    ok "SIGINT to mpiexec (Ctrl-C): every rank stops cleanly at a step boundary (mpiexec status $rc)"
else bad "SIGINT to mpiexec" "rc=$rc $(grep -E 'error|received|Segm' s.out | head -3)"; fi
# SIGUSR1 to one rank: the message names that rank and signal (not "signal 0")
start_long s.out
kill -USR1 "$(pid_of 2)"
end_long 60
if [ $rc -eq 75 ] && grep -q "rank 2 received SIGUSR1" s.out; then ok "SIGUSR1 to rank 2 named in the stop message"
else bad "SIGUSR1 to rank 2" "rc=$rc $(grep -E 'received|error' s.out | head -3)"; fi
# a second SIGTERM ends at once, with a message, non-zero (rank 2 is stopped, so the step
# in progress cannot end and the first SIGTERM alone would wait)
start_long s.out
p=$(pid_of 1)
p2=$(pid_of 2)
kill -STOP "$p2"
kill -TERM "$p"
sleep 0.3
kill -TERM "$p"
t0=$(date +%s)
end_long 30
kill -CONT "$p2" 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 75 ] && grep -q "second stop signal (SIGTERM)" s.out && [ "$(since $t0)" -le 10 ]; then
    ok "a second SIGTERM ends the job at once: rc $rc in $(since $t0) s"
else bad "second SIGTERM" "rc=$rc after $(since $t0) s: $(grep -E 'error' s.out | head -3)"; fi
# a stop that the step cannot honour (a peer is stopped) aborts after the grace period
start_long s.out --stop-grace 3
p2=$(pid_of 2)
kill -STOP "$p2"
sleep 0.5
kill -TERM "$(pid_of 0)"
t0=$(date +%s)
end_long 40
kill -CONT "$p2" 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 75 ] && grep -q "asked for a stop, but this step cannot finish" s.out && [ "$(since $t0)" -le 20 ]; then
    ok "SIGTERM while a peer is stopped: abort after the grace, rc $rc in $(since $t0) s"
else bad "SIGTERM with a stopped peer" "rc=$rc after $(since $t0) s: $(grep -E 'error' s.out | head -3)"; fi

# 4. the watchdog: a rank stopped with SIGSTOP; the peers name what they wait for and abort
start_long w.out --watchdog 6
p2=$(pid_of 2)
kill -STOP "$p2"
t0=$(date +%s)
end_long 60
kill -CONT "$p2" 2>/dev/null
if [ $rc -ne 0 ] && grep -q "watchdog: waited .* s for .*step [0-9]" w.out && [ "$(since $t0)" -le 25 ]; then
    ok "watchdog: rc $rc in $(since $t0) s: $(grep -m1 'watchdog: waited' w.out | cut -c1-170)"
else bad "watchdog" "rc=$rc after $(since $t0) s: $(grep -E 'error|note' w.out | head -3)"; fi

# 5. back-off: while rank 2 is stopped for 7 s the others use little CPU, say what they wait
# for (a note at a quarter of the watchdog), then the run goes on
start_long b.out --watchdog 20
p0=$(pid_of 0); p1=$(pid_of 1); p2=$(pid_of 2)
kill -STOP "$p2"
sleep 1
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
c0=$(( $(cpu $p0) + $(cpu $p1) ))
sleep 5
c1=$(( $(cpu $p0) + $(cpu $p1) ))
sleep 1
kill -CONT "$p2"
n0=$(grep -c '"event":"step"' long.jsonl)
sleep 2
n1=$(grep -c '"event":"step"' long.jsonl)
kill -TERM "$p0"
end_long 60
ticks=$((c1 - c0)) # clock ticks (100/s) used by ranks 0 and 1 in 5 s
if [ $rc -eq 75 ] && [ $ticks -le 100 ] && [ $n1 -gt $n0 ] && grep -q "still waiting after" b.out; then
    ok "back-off: ranks 0+1 used $ticks ticks (of 1000) in 5 s while rank 2 was stopped; a note was printed; steps went on after SIGCONT ($n0 -> $n1)"
else bad "back-off" "rc=$rc ticks=$ticks steps $n0 -> $n1 $(grep -E 'error|note' b.out | head -3)"; fi

# 6. a rank killed with -9 mid-step: the others end non-zero within seconds
start_long k.out
kill -9 "$(pid_of 1)"
t0=$(date +%s)
end_long 30
if [ $rc -ne 0 ] && [ "$(since $t0)" -le 10 ] && [ -z "$(pgrep -f "pipelm train.*$WORK")" ]; then
    ok "kill -9 of rank 1: job gone in $(since $t0) s, rc $rc"
else bad "kill -9" "rc=$rc after $(since $t0) s"; pkill -9 -f "pipelm train.*$WORK"; fi
pkill -9 -f "pipelm train.*$WORK" 2>/dev/null

# a rank that hangs inside the checkpoint's collective HDF5 calls (which no poll can watch):
# the deadline threads end every rank, naming it, and the previous checkpoint stays the latest
t0=$(date +%s)
mpirun_t 120 2 train $COMMON --steps 4 --ckpt-dir stall --ckpt-every 1 --watchdog 3 --fail-rank 1 --fail-step 2 \
    --fail-at stall > stall.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(since $t0)" -le 30 ] && [ "$(cat stall/latest)" = ckpt_00000001.h5 ] &&
    grep -q "rank 1: error: watchdog: this rank stalled for more than .* before it reached the checkpoint save (collective HDF5)" stall.out; then
    ok "a rank hung in the checkpoint's HDF5 collectives: all ended in $(since $t0) s, rc $rc, ckpt_00000001 still the latest"
else bad "hang inside HDF5" "rc=$rc after $(since $t0) s: $(grep error stall.out | head -3)"; pkill -9 -f "pipelm train.*$WORK"; fi
finish
