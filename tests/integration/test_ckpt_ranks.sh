#!/bin/bash
# test_ckpt_ranks.sh — checkpoints across ranks: a 3-stage save loads on 1, 2 and 4 ranks (and other
# splits the other way) with bit-identical parameters and moments; injected failures (write,
# rename, a rank SIGKILLed mid-write) and a full file system leave `latest` on the previous
# checkpoint, loadable; keep=K prunes only after a good save; llm.c -> checkpoint -> llm.c is
# byte-identical; collective data transfers (PIPELM_CKPT_XFER=collective) write a file that
# loads the same, and an injected failure there ends the save without a hang; train's
# --ckpt-verify, --ckpt-space-check, --ckpt-hints and --ckpt-xfer take effect (also from a
# config file) and win over their alias variables, which still work; inspect
# verifies every CRC-32C and names a corrupted dataset, as a load does; h5py reads the file
# as the schema says and recomputes a few crc32c attributes; and, once `pipelm train` saves checkpoints, a run killed after
# its step-2 checkpoint resumes to the same final weights as an uninterrupted run.
# Multi-rank saves use tests/unit/test_ckpt's driver mode (see its usage()). Every mpiexec runs
# under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
SRC=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(dirname "$PIPELM")/tests/unit/test_ckpt
if [ ! -x "$T" ]; then
    echo "SKIP: $T is not built"
    exit 77
fi
cd "$WORK"

# drv SECONDS NP ARGS...: the test driver under mpiexec with a hard timeout.
drv() {
    local secs=$1 np=$2
    shift 2
    timeout -k 5 "$secs" "$MPIEXEC" -n "$np" "$T" "$@"
}

# --- any split reads any checkpoint -----------------------------------------------------------
if drv 180 3 save s3 5 1,1,1 0 7 > s3.out 2>&1; then ok "save on 3 ranks (split 1,1,1)"; else bad "save on 3 ranks" "$(tail -n 3 s3.out)"; fi
for spec in "1 3" "2 2,1" "4 0,1,1,1"; do
    set -- $spec
    if drv 180 "$1" load s3 "$2" 7 5 > l.out 2>&1; then ok "3-stage checkpoint loads on $1 rank(s) (split $2), identical"
    else bad "load on $1 rank(s) split $2" "$(tail -n 2 l.out)"; fi
done
if drv 120 2 save s2 6 0,3 0 8 > s2.out 2>&1 && drv 180 3 load s2/ckpt_00000006.h5 2,0,1 8 6 > l.out 2>&1; then
    ok "2-stage checkpoint (first stage embeddings only) loads on 3 ranks (split 2,0,1)"
else bad "save 0,3 / load 2,0,1" "$(tail -n 2 s2.out l.out)"; fi

# --- collective data transfers (the alternative to the default independent ones) ----------------
if PIPELM_CKPT_XFER=collective drv 180 3 save sc 5 1,1,1 0 7 > sc.out 2>&1 && drv 180 2 load sc 2,1 7 5 > l.out 2>&1 &&
    PIPELM_CKPT_XFER=collective drv 180 2 load sc 1,2 7 5 > l2.out 2>&1; then
    ok "PIPELM_CKPT_XFER=collective: 3-rank save loads on 2 ranks (independent and collective reads), identical"
else bad "collective transfers" "$(tail -n 2 sc.out l.out l2.out)"; fi
d=f_coll
drv 120 2 save $d 1 1,2 1 7 > /dev/null 2>&1
PIPELM_CKPT_XFER=collective PIPELM_CKPT_FAIL=write:0 drv 120 2 save $d 2 1,2 1 8 > $d.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 0: injected failure" $d.out && [ "$(cat $d/latest)" = ckpt_00000001.h5 ] &&
    [ -z "$(ls -A $d | grep tmp)" ]; then
    ok "PIPELM_CKPT_XFER=collective: rank 0 failing half way ends the save (exit $rc, no hang), step 1 still latest"
else bad "collective transfers, injected failure" "exit $rc: $(tail -n 2 $d.out)"; fi

# --- failures leave the previous checkpoint in place ------------------------------------------
# fails DIR: latest still names step 1, step 1 loads, no step-2 file or temporary file
fails() {
    [ "$(cat "$1/latest")" = ckpt_00000001.h5 ] && [ ! -e "$1/ckpt_00000002.h5" ] &&
        [ -z "$(ls -A "$1" | grep tmp)" ] && drv 120 1 load "$1" 3 7 1 > /dev/null 2>&1
}
for mode in write rename; do
    d=f_$mode
    drv 120 2 save $d 1 1,2 1 7 > /dev/null 2>&1
    PIPELM_CKPT_FAIL=$mode drv 120 2 save $d 2 1,2 1 8 > $d.out 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "PIPELM_CKPT_FAIL=$mode" $d.out && fails $d; then
        ok "injected $mode failure: exit $rc, named ($(grep -o 'rank [0-9]*: inj[^(]*' $d.out | head -n 1)), step 1 still latest and loadable"
    else bad "injected $mode failure" "exit $rc: $(tail -n 2 $d.out)"; fi
done
d=f_kill
drv 120 2 save $d 1 1,2 1 7 > /dev/null 2>&1
PIPELM_CKPT_FAIL=kill:1 drv 120 2 save $d 2 1,2 1 8 > $d.out 2>&1
rc=$?
stale=$(ls -A $d | grep -c tmp)
# the temporary file of the killed save is ignored, then cleared by the next save
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(cat $d/latest)" = ckpt_00000001.h5 ] && [ ! -e $d/ckpt_00000002.h5 ] &&
    drv 120 1 load $d 3 7 1 > /dev/null 2>&1; then
    ok "rank 1 SIGKILLed mid-write: exit $rc, step 1 still latest and loadable ($stale temporary file left)"
else bad "SIGKILL mid-write" "exit $rc: $(tail -n 2 $d.out)"; fi
if drv 120 2 save $d 3 1,2 1 9 > /dev/null 2>&1 && [ -z "$(ls -A $d | grep tmp)" ] && [ "$(cat $d/latest)" = ckpt_00000003.h5 ] &&
    [ ! -e $d/ckpt_00000001.h5 ]; then ok "the next save clears the stale temporary file and prunes"
else bad "save after a kill" "$(ls -A $d | tr '\n' ' ')"; fi

# a full file system (a small tmpfs; needs mount permission)
mkdir -p mnt
export TEST_CKPT_DIMS=256,64,2,2,128  # data large against HDF5's metadata, as in real models
drv 120 2 save probe 1 1,1 0 7 > /dev/null 2>&1
S=$(stat -c %s probe/ckpt_00000001.h5 2>/dev/null || echo 0)
if [ "$S" -gt 0 ] && mount -t tmpfs -o size=$(( (S + S / 2 + 8191) / 4096 * 4096 )) tmpfs mnt 2> /dev/null; then
    drv 120 2 save mnt/ck 1 1,1 1 7 > /dev/null 2>&1
    drv 120 2 save mnt/ck 2 1,1 1 8 > full.out 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "No space left on device" full.out &&
        [ "$(cat mnt/ck/latest)" = ckpt_00000001.h5 ] && [ -z "$(ls -A mnt/ck | grep tmp)" ] &&
        drv 120 2 load mnt/ck 1,1 7 1 > /dev/null 2>&1; then
        ok "full file system: save fails ($(grep -o 'not enough space[^(]*' full.out | head -n 1)), step 1 intact"
    else bad "full file system" "exit $rc: $(tail -n 2 full.out)"; fi
    umount mnt
else
    echo "skip - full file system (cannot mount a tmpfs here)"
fi
unset TEST_CKPT_DIMS

# --- keep=K -------------------------------------------------------------------------------------
for s in 1 2 3; do drv 120 2 save keep $s 2,1 2 $s > /dev/null 2>&1; done
if [ "$(ls keep | grep -c '^ckpt_')" = 2 ] && [ -e keep/ckpt_00000002.h5 ] && [ -e keep/ckpt_00000003.h5 ] &&
    drv 120 1 load keep 3 3 3 > /dev/null 2>&1; then ok "keep=2 leaves the newest two"
else bad "keep=2" "$(ls keep | tr '\n' ' ')"; fi

# --- llm.c <-> checkpoint, inspect, h5py --------------------------------------------------------
TOOL=("$PIPELM")
drv 60 1 mkllmc m.bin 11 > /dev/null 2>&1
if "${TOOL[@]}" convert m.bin m.h5 > c1.out 2>&1 && "${TOOL[@]}" convert m.h5 back.bin > c2.out 2>&1 && cmp -s m.bin back.bin; then
    ok "llm.c -> checkpoint -> llm.c byte-identical ($(basename "${TOOL[0]}") convert)"
else bad "convert round trip" "$(tail -n 2 c1.out c2.out)"; fi
"${TOOL[@]}" inspect m.h5 > i1.out 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "all 120 checksums OK" i1.out && grep -q 'format .*"pipelm-checkpoint"' i1.out; then
    ok "inspect: every checksum holds, exit 0"
else bad "inspect of a good file" "exit $rc: $(tail -n 2 i1.out)"; fi
# an independent reader (h5py, which ./jobs/setup.sh --test installs: its absence fails)
/usr/bin/python3 "$SRC/tests/reference/ckpt_h5py.py" m.bin m.h5 > py.out 2>&1
rc=$?
if [ $rc -eq 0 ]; then ok "h5py reads it: $(sed 's/^ckpt_h5py: //' py.out)"
else bad "h5py check (exit $rc)" "$(cat py.out)"; fi
cp m.h5 bad.h5
drv 60 1 corrupt bad.h5 /model/h.1/qkv_w
"${TOOL[@]}" inspect bad.h5 > i2.out 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "/model/h.1/qkv_w .*FAILED" i2.out && grep -q "CHECKSUM FAILED" i2.out &&
    grep -q "/model/h.1/qkv_w: CRC-32C mismatch" i2.out; then
    ok "inspect: a flipped byte fails /model/h.1/qkv_w, exit 1"
else bad "inspect of a corrupt file" "exit $rc: $(grep FAIL i2.out | head -n 2)"; fi
drv 120 2 load bad.h5 1,2 11 0 > l.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "dataset /model/h.1/qkv_w: CRC-32C mismatch (stored 0x" l.out; then
    ok "a 2-rank load of the corrupt file fails naming the dataset ($(grep -o 'rank [0-9]*: dataset [^ ]*: CRC-32C mismatch' l.out | head -n 1))"
else bad "load of a corrupt file" "exit $rc: $(tail -n 2 l.out)"; fi
PIPELM_CKPT_XFER=collective drv 120 2 load bad.h5 1,2 11 0 > l.out 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "dataset /model/h.1/qkv_w: CRC-32C mismatch (stored 0x" l.out; then
    ok "the same with collective reads (PIPELM_CKPT_XFER=collective)"
else bad "collective load of a corrupt file" "exit $rc: $(tail -n 2 l.out)"; fi

# --- pipelm train: the checkpoint options, and their variables as aliases that lose to them ------
O="--preset tiny --steps 1 --batch 4 --seq-len 16 --eval-every 0 --progress 0 --log-every 100 --ckpt-every 1"
printf 'ckpt_verify = 0\n' > v0.ini
# a corrupted save is published only without the verification; the run line shows the settings
PIPELM_CKPT_FAIL=corrupt PIPELM_CKPT_NO_SPACE_CHECK=1 mpirun_t 60 1 train $O --config v0.ini --ckpt-dir v1 \
    --metrics v1.jsonl > v1.out 2>&1
rc1=$?
PIPELM_CKPT_FAIL=corrupt PIPELM_CKPT_VERIFY=0 mpirun_t 60 1 train $O --ckpt-dir v2 > v2.out 2>&1
rc2=$?
PIPELM_CKPT_FAIL=corrupt PIPELM_CKPT_VERIFY=0 PIPELM_CKPT_NO_SPACE_CHECK=1 mpirun_t 60 1 train $O --ckpt-dir v3 \
    --ckpt-verify 1 --ckpt-space-check 1 --metrics v3.jsonl > v3.out 2>&1
rc3=$?
if [ $rc1 -eq 0 ] && [ -e v1/ckpt_00000001.h5 ] && grep -q '"ckpt-verify":0,"ckpt-space-check":0' v1.jsonl &&
    [ $rc2 -eq 0 ] && [ -e v2/ckpt_00000001.h5 ] && [ $rc3 -ne 0 ] && [ $rc3 -ne 124 ] && [ ! -e v3/ckpt_00000001.h5 ] &&
    grep -q "verifying the written file" v3.out && grep -q '"ckpt-verify":1,"ckpt-space-check":1' v3.jsonl; then
    ok "ckpt_verify = 0 (config file) and PIPELM_CKPT_VERIFY=0 skip the verification; --ckpt-verify 1 and --ckpt-space-check 1 win over their variables"
else bad "--ckpt-verify / --ckpt-space-check" "exits $rc1 $rc2 $rc3: $(tail -n 2 v1.out v2.out v3.out)"; fi
# the hints reach MPI-IO (ROMIO prints them when it opens the file)
ROMIO_PRINT_HINTS=1 PIPELM_CKPT_HINTS=cb_buffer_size=1048577 mpirun_t 60 1 train $O --ckpt-dir h1 > h1.out 2>&1
ROMIO_PRINT_HINTS=1 PIPELM_CKPT_HINTS=cb_buffer_size=1048577 mpirun_t 60 1 train $O --ckpt-dir h2 \
    --ckpt-hints cb_buffer_size=2097153 > h2.out 2>&1
if grep -q "cb_buffer_size .*= 1048577" h1.out && grep -q "cb_buffer_size .*= 2097153" h2.out &&
    ! grep -q "= 1048577" h2.out; then
    ok "PIPELM_CKPT_HINTS reaches MPI-IO, and --ckpt-hints wins over it"
else bad "--ckpt-hints" "$(grep cb_buffer_size h1.out h2.out | head -n 4)"; fi
# an unknown transfer mode is refused at start-up naming the variable; the option wins over it
PIPELM_CKPT_XFER=sometimes mpirun_t 60 1 train $O --ckpt-dir x1 > x1.out 2>&1
rc1=$?
PIPELM_CKPT_XFER=sometimes PIPELM_CKPT_FAIL=write:0 mpirun_t 120 2 train $O --steps 2 --ckpt-dir x2 \
    --ckpt-xfer collective > x2.out 2>&1
rc2=$?
if [ $rc1 -eq 2 ] && grep -q "PIPELM_CKPT_XFER.*'sometimes'" x1.out && [ $rc2 -ne 0 ] && [ $rc2 -ne 124 ] &&
    grep -q "rank 0: injected failure" x2.out && [ ! -e x2/latest ]; then
    ok "PIPELM_CKPT_XFER=sometimes is refused; --ckpt-xfer collective wins over it, and a failing rank ends the save (no hang)"
else bad "--ckpt-xfer" "exits $rc1 $rc2: $(tail -n 2 x1.out x2.out)"; fi

# --- pipelm train: resume is bit-identical ------------------------------------------------------
COMMON="--preset tiny --steps 4 --batch 8 --seq-len 32 --microbatches 2 --eval-every 0 --progress 0 --log-every 100"
mpirun_t 180 2 train $COMMON --metrics ref.jsonl --save-final ref.bin > ref.out 2>&1 || bad "reference run" "$(tail -n 2 ref.out)"
# killed at step 3, after the step-2 checkpoint
mpirun_t 180 2 train $COMMON --ckpt-dir run --ckpt-every 2 --fail-rank 1 --fail-step 3 > cut.out 2>&1
if [ -e run/ckpt_00000002.h5 ]; then ok "interrupted run left its step-2 checkpoint"; else bad "interrupted run" "$(tail -n 2 cut.out)"; fi
for P in 2 3; do
    mpirun_t 180 $P train $COMMON --ckpt-dir run --resume --metrics res$P.jsonl --save-final res$P.bin > res$P.out 2>&1
    if cmp -s ref.bin res$P.bin && [ "$(losses ref.jsonl | tail -n 2)" = "$(losses res$P.jsonl | tail -n 2)" ]; then
        ok "resumed on $P ranks: steps 3-4 and the final weights bit-identical to an uninterrupted run"
    else bad "resume on $P ranks" "$(tail -n 2 res$P.out)"; fi
    rm -f run/ckpt_00000004.h5 && echo ckpt_00000002.h5 > run/latest
done

finish
