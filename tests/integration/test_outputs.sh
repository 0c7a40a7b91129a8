#!/bin/bash
# Outputs, full disks, messages under --dp, schedule memory and early signals (trust II):
# - no output path of any subcommand replaces or writes a device or FIFO (made here with mknod
#   and mkfifo), none blocks, and an output that is an input (or another output) is refused;
# - a full filesystem (a 64 KiB tmpfs mounted here; those checks skip only if it cannot be
#   mounted) under --trace or --metrics warns by name and costs nothing; under --save-final it
#   ends the job by name after the checkpoint is saved;
# - under --dp, injected NaNs and failures name world rank, stage and replica consistently,
#   and a rank that fails in set-up does not hang its replicas;
# - `pipelm schedule` refuses a build too large for memory before building it;
# - a SIGTERM that arrives before step 1 is a clean stop (exit 75), not a kill.
# Every run is under a timeout.
source "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
COMMON="--preset tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0"
since() { echo $(($(date +%s) - $1)); }

"$PIPELM" train $COMMON --steps 2 --save-final m.bin > /dev/null 2>&1 || bad "set-up" "no model file"
"$PIPELM" convert m.bin c.h5 > /dev/null 2>&1 || bad "set-up" "no checkpoint"
sum_m=$(md5sum < m.bin)
sum_c=$(md5sum < c.h5)

# 1. outputs that are not regular files: a character device (/dev/full's numbers) and a FIFO
mknod full c 1 7 2>/dev/null || bad "mknod" "cannot make a device node here"
mkfifo fifo
is_dev() { [ -c "$1" ]; }
for in in m.bin c.h5; do
    timeout 20 "$PIPELM" convert "$in" full > o.out 2>&1; rc=$?
    if [ $rc -eq 1 ] && is_dev full && grep -q "output full: is a character device" o.out && ! grep -q converted o.out; then
        ok "convert $in to a character device: refused (rc 1), the node is still a device"
    else bad "convert $in to a device" "rc=$rc $(ls -l full) $(head -2 o.out)"; fi
    timeout 20 "$PIPELM" convert "$in" fifo > o.out 2>&1; rc=$?
    if [ $rc -eq 1 ] && [ -p fifo ] && grep -q "is a FIFO" o.out; then ok "convert $in to a FIFO: refused at once"
    else bad "convert $in to a FIFO" "rc=$rc $(head -2 o.out)"; fi
done
ls *.tmp > /dev/null 2>&1 && bad "temporary files" "left behind: $(ls *.tmp)"
# the same file, through its own name, a hard link and a symbolic link
ln m.bin hard.bin
ln -s m.bin soft.bin
for out in m.bin hard.bin soft.bin; do
    timeout 20 "$PIPELM" convert m.bin $out > o.out 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "is the same file as input m.bin" o.out && [ "$(md5sum < m.bin)" = "$sum_m" ]; then
        ok "convert m.bin $out: refused as its own input (rc 2), input unchanged"
    else bad "convert m.bin $out" "rc=$rc $(head -2 o.out)"; fi
done
timeout 20 "$PIPELM" convert c.h5 c.h5 > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(md5sum < c.h5)" = "$sum_c" ]; then ok "convert c.h5 c.h5: refused, checkpoint unchanged"
else bad "convert c.h5 c.h5" "rc=$rc $(head -2 o.out)"; fi
# through a link to another file: the link stays, the file it names is written
echo old > target.bin
ln -s target.bin link.bin
if timeout 20 "$PIPELM" convert c.h5 link.bin > o.out 2>&1 && [ -L link.bin ] && cmp -s target.bin m.bin; then
    ok "convert to a symbolic link writes the file it names (the link stays)"
else bad "convert through a link" "$(ls -l link.bin target.bin) $(head -2 o.out)"; fi
# /dev/null: an llm.c file is discarded; a checkpoint (published by a rename) is refused
if timeout 20 "$PIPELM" convert c.h5 /dev/null > o.out 2>&1 && [ -c /dev/null ]; then ok "convert to /dev/null (llm.c file)"
else bad "convert to /dev/null" "$(head -2 o.out)"; fi
timeout 20 "$PIPELM" convert m.bin /dev/null > o.out 2>&1; rc=$?
if [ $rc -eq 1 ] && [ -c /dev/null ] && grep -q "cannot be written to /dev/null" o.out; then
    ok "a checkpoint to /dev/null: refused, /dev/null still a device"
else bad "checkpoint to /dev/null" "rc=$rc $(ls -l /dev/null) $(head -2 o.out)"; fi

# schedule --csv
timeout 20 "$PIPELM" schedule --stages 2 --microbatches 4 --csv full > o.out 2>&1; rc=$?
if [ $rc -eq 1 ] && is_dev full && ! grep -q wrote o.out; then ok "schedule --csv to a device: refused"
else bad "schedule --csv device" "rc=$rc $(tail -2 o.out)"; fi
timeout 20 "$PIPELM" schedule --stages 2 --microbatches 4 --csv fifo > o.out 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "is a FIFO" o.out; then ok "schedule --csv to a FIFO: refused, no block"
else bad "schedule --csv FIFO" "rc=$rc $(tail -2 o.out)"; fi
"$PIPELM" schedule --stages 2 --microbatches 4 --csv s.csv > /dev/null 2>&1
sum_s=$(md5sum < s.csv)
timeout 20 "$PIPELM" schedule --load s.csv --csv s.csv > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "same file as --load" o.out && [ "$(md5sum < s.csv)" = "$sum_s" ]; then
    ok "schedule --csv over its own --load: refused"
else bad "schedule --csv = --load" "rc=$rc $(tail -2 o.out)"; fi
# train and bench outputs
t() { mpirun_t 60 1 "$@" > o.out 2>&1; }
for opt in "--save-final full" "--dump-grads full" "--trace full" "--metrics full" "--metrics fifo"; do
    t train $COMMON --steps 1 $opt; rc=$?
    if [ $rc -ne 0 ] && is_dev full && grep -q "error: .*is a " o.out; then ok "train $opt: refused before step 1"
    else bad "train $opt" "rc=$rc $(grep error o.out | head -2)"; fi
done
for opt in "--json full" "--csv full" "--costs-out full"; do
    t bench $COMMON --steps 1 --warmup 0 $opt; rc=$?
    if [ $rc -ne 0 ] && is_dev full && grep -q "error: .*is a " o.out; then ok "bench $opt: refused"
    else bad "bench $opt" "rc=$rc $(grep error o.out | head -2)"; fi
done
t train $COMMON --steps 1 --init m.bin --save-final hard.bin; rc=$?
if [ $rc -eq 2 ] && grep -q "same file as --init" o.out && [ "$(md5sum < m.bin)" = "$sum_m" ]; then
    ok "--save-final onto its own --init (a hard link): refused, rc 2"
else bad "--save-final = --init" "rc=$rc $(grep error o.out | head -2)"; fi
t train $COMMON --steps 1 --metrics same.out --trace ./same.out; rc=$?
if [ $rc -eq 2 ] && grep -q "is the same file as" o.out; then ok "two outputs naming one file: refused"
else bad "two outputs, one file" "rc=$rc $(grep error o.out | head -2)"; fi
t train $COMMON --steps 2 --save-final /dev/null --metrics /dev/null --trace /dev/null; rc=$?
if [ $rc -eq 0 ] && [ -c /dev/null ]; then ok "outputs to /dev/null: accepted, /dev/null still a device"
else bad "outputs to /dev/null" "rc=$rc $(grep error o.out | head -2)"; fi

mkdir ckf && mkfifo ckf/latest
t train $COMMON --steps 2 --ckpt-dir ckf; rc=$?
if [ $rc -eq 1 ] && [ -p ckf/latest ] && grep -q "ckf/latest: is a FIFO" o.out && ! ls ckf/*.h5 > /dev/null 2>&1; then
    ok "--ckpt-dir whose latest is a FIFO: refused before step 1, the FIFO untouched"
else bad "--ckpt-dir latest FIFO" "rc=$rc $(grep error o.out | head -2)"; fi

# 2. full filesystems
mkdir -p small
if mount -t tmpfs -o size=64k tmpfs small 2>/dev/null; then
    trap 'umount "$WORK/small" 2>/dev/null; rm -rf "$WORK"' EXIT
    mpirun_t 120 4 train $COMMON --dp 2 --steps 8 --save-final ref.bin > /dev/null 2>&1
    # a trace that cannot fit: warned, removed, the weights still saved and the same
    dd if=/dev/zero of=small/fill bs=1k count=60 2>/dev/null
    mpirun_t 120 4 train $COMMON --dp 2 --steps 8 --trace small/t.json --save-final fin.bin > o.out 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "warning: trace small/t.json: writing it failed: No space left on device" o.out &&
        cmp -s fin.bin ref.bin && [ ! -e small/t.json ]; then
        ok "--trace on a full disk (4 ranks, --dp 2): warned by name, partial trace removed, weights saved"
    else bad "--trace on a full disk" "rc=$rc $(grep -E 'error|warning' o.out | head -3)"; fi
    # metrics on a full disk: warned once, the file cut back to whole lines
    rm -f small/fill
    dd if=/dev/zero of=small/fill bs=1k count=60 2>/dev/null
    mpirun_t 120 2 train $COMMON --steps 40 --metrics small/m.jsonl > o.out 2>&1; rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c 'warning: metrics file small/m.jsonl: writing it failed' o.out)" = 1 ] &&
        python3 -c "import json,sys; [json.loads(l) for l in open('small/m.jsonl')]" 2>/dev/null; then
        ok "--metrics on a full disk: one warning, the file is whole JSON lines ($(wc -l < small/m.jsonl) kept)"
    else bad "--metrics on a full disk" "rc=$rc $(grep -E 'warning|error' o.out | head -2)"; fi
    # the final weights on a full disk: the checkpoint is saved first, the job ends by name
    rm -f small/*
    dd if=/dev/zero of=small/fill bs=1k count=60 2>/dev/null
    mpirun_t 120 2 train $COMMON --steps 4 --ckpt-dir ck --save-final small/fin.bin > o.out 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q "save-final small/fin.bin was not written" o.out && [ "$(cat ck/latest)" = ckpt_00000004.h5 ] &&
        "$PIPELM" inspect ck/ckpt_00000004.h5 > /dev/null 2>&1 && ! ls small/*.tmp > /dev/null 2>&1; then
        ok "--save-final on a full disk: rc 1 by name, the step-4 checkpoint saved and verified, no temporary left"
    else bad "--save-final on a full disk" "rc=$rc $(grep error o.out | head -3)"; fi
    umount small
else
    echo "SKIP - full-disk checks: cannot mount a tmpfs here (not root, or no mount namespace)"
fi

# 3. messages under --dp: world rank, stage and replica, and what the NaN is
mpirun_t 60 4 train $COMMON --dp 2 --steps 4 --fail-rank 2 --fail-step 2 --fail-at nan > o.out 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    grep -q "rank 0: error: .*the weights of stage 1 of replica 0 (rank 2) already hold a non-finite value.*injected" o.out &&
    [ "$(grep -c 'non-finite loss' o.out)" = 1 ] && ! grep -q "try a lower --lr" o.out; then
    ok "--dp 2 NaN on rank 2: one diagnosis, stage 1 of replica 0 (rank 2), injected (no --lr advice)"
else bad "--dp NaN message" "rc=$rc $(grep error o.out | head -3)"; fi
mpirun_t 60 4 train $COMMON --dp 2 --steps 4 --fail-rank 3 --fail-step 2 > o.out 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 3: error: injected failure (--fail-rank 3 " o.out; then
    ok "--dp 2 --fail-rank 3: the message names world rank 3"
else bad "--dp fail-rank message" "rc=$rc $(grep error o.out | head -3)"; fi
t0=$(date +%s)
mpirun_t 60 4 train $COMMON --dp 2 --steps 4 --fail-rank 3 --fail-step 0 > o.out 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(since $t0)" -le 30 ] &&
    grep -q "rank 3 (pipeline rank 1 of replica 1) failed during set-up" o.out; then
    ok "--dp 2: a rank failing in set-up ends all ranks (rc $rc in $(since $t0) s; its replica hung before)"
else bad "--dp set-up failure" "rc=$rc after $(since $t0) s $(grep error o.out | head -3)"; pkill -9 -f "pipelm train.*$WORK"; fi

# 4. pipelm schedule: memory estimated before the build
t0=$(date +%s)
timeout 60 "$PIPELM" schedule --stages 1024 --microbatches 4096 --schedule interleaved-zb --chunks-per-rank 64 > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(since $t0)" -le 10 ] && grep -q "needs about .* GiB .* --mem-limit-gb" o.out; then
    ok "schedule P=1024 V=64 M=4096: refused by its memory estimate at once (rc 2)"
else bad "schedule memory" "rc=$rc after $(since $t0) s $(head -2 o.out)"; fi
timeout 60 "$PIPELM" schedule --stages 8 --microbatches 64 --mem-limit-gb 0.00001 > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && timeout 60 "$PIPELM" schedule --stages 8 --microbatches 64 --mem-limit-gb 1 --grid no > /dev/null 2>&1; then
    ok "--mem-limit-gb sets the limit"
else bad "--mem-limit-gb" "rc=$rc $(head -2 o.out)"; fi
for args in "--stages 2 --microbatches 2 --grid maybe" "--load s.csv --stages 3" "--load s.csv --microbatches 3"; do
    timeout 20 "$PIPELM" schedule $args > o.out 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q error o.out; then ok "schedule $args: refused, rc 2"
    else bad "schedule $args" "rc=$rc $(head -2 o.out)"; fi
done

# 5. a SIGTERM before step 1: caught (the handlers are installed before MPI_Init), exit 75
caught_term() { # PID: has it installed its SIGTERM handler? (bit 15 of SigCgt)
    local m
    m=$(awk '/^SigCgt:/ {print $2}' /proc/$1/status 2>/dev/null) || return 1
    [ -n "$m" ] && [ $(( (0x$m >> 14) & 1 )) -eq 1 ]
}
# the tutorial model (30M parameters) so that set-up, between the handler and step 1, takes
# about 2 s: the tiny one's took 0.4 s only while every process also loaded cuBLAS at start-up,
# and this loop's polling then missed it
mpirun_t 60 2 train --preset tutorial --batch 4 --microbatches 2 --seq-len 16 --progress 0 --steps 100000 \
    --metrics early.jsonl > o.out 2>&1 &
job=$!
p=""
for i in $(seq 1 400); do
    for q in $(pgrep -f "pipelm train.*early.jsonl"); do # a rank, not timeout or mpiexec
        [ "$(readlink -f /proc/$q/exe 2>/dev/null)" = "$(readlink -f "$PIPELM")" ] && caught_term $q && p=$q && break
    done
    [ -n "$p" ] && break
    sleep 0.01
done
if [ -n "$p" ]; then
    kill -TERM "$p"
    wait $job
    rc=$?
    if [ $rc -eq 75 ] && grep -q "received SIGTERM before step 1: stopping without training" o.out &&
        grep -q '"event":"end".*"preempted":true' early.jsonl; then
        ok "SIGTERM as soon as a rank's handler is in place (before MPI_Init): stopped before step 1, rc 75"
    else bad "early SIGTERM" "rc=$rc $(grep -E 'error|received|signal' o.out | head -3)"; fi
else
    bad "early SIGTERM" "no rank showed a SIGTERM handler"
    kill $job 2>/dev/null
fi
finish
