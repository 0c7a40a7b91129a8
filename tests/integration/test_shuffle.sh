#!/bin/bash
# test_shuffle.sh — issue 39: shuffled shards through --data, seen through the data log (the
# test hook PIPELM_DATA_LOG: each replica's first stage writes "step row SHARD POS" for every
# row it reads). Three uint16 shards of 9, 13 and 10 sequences of 16 + 1 (an epoch is 32
# sequences, 4 steps of a global batch of 8):
#   a. at (T, D, P) = (1, 2, 2): every sequence of epoch 0 read exactly once over the two
#      replicas, each replica only its own rows, the shards and sequences not in file order,
#      epoch 1 (steps 5-6) in another order;
#   b. the rows of every step at (1, 1, 4) and at (2, 2, 1) are those of (1, 2, 2), and the
#      losses agree (--grad-accum exact); the batches prefetched one step ahead (the default)
#      give the losses of reading each when needed (PIPELM_PREFETCH=0) bit for bit, and the
#      timers report the data wait;
#   c. a run of 3 steps at (1, 1, 4) resumed mid-epoch at (2, 2, 1) reads steps 4-6 exactly
#      as the straight run, and its losses agree;
#   d. --shuffle 0 reads the shards and their sequences in order; --shuffle 1 shuffles a single
#      file; --shuffle 1 with Markov data and --shuffle 2 are refused by name.
# Every mpiexec runs under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
/usr/bin/python3 -c "
import struct, random
random.seed(1)
for i, n in enumerate([9, 13, 10]):
    k = n * 16 + 1 + i
    open('sh_%d.bin' % i, 'wb').write(struct.pack('<256i', 20240520, 1, k, *[0] * 253)
                                     + struct.pack('<%dH' % k, *[random.randrange(256) for _ in range(k)]))
" || bad "shards" "python3 failed"
# every sequence of the set, "SHARD POS", in file order
for s in 0:9 1:13 2:10; do for ((l = 0; l < ${s#*:}; l++)); do echo "sh_${s%:*}.bin $((l * 16))"; done; done > all.txt
C="--preset tiny --batch 8 --seq-len 16 --eval-every 0 --progress 0 --log-every 1 --threads 1 --grad-accum exact
   --lr-schedule constant"
# trn TAG NP ARGS...: a training run with the data log into TAG.<rank>, metrics TAG.jsonl
trn() {
    local tag=$1 np=$2
    shift 2
    PIPELM_DATA_LOG=$tag mpirun_t 120 "$np" train $C --metrics "$tag.jsonl" "$@" > "$tag.out" 2>&1 \
        || bad "$tag" "exit $? $(grep -m2 error "$tag.out")"
}
# rows TAG: every rank's log as one list, by step and row
rows() { cat "$1".[0-9]* 2> /dev/null | sort -n -k1,1 -k2,2; }

trn a 4 --data 'sh_*.bin' --dp 2 --stages 2 --steps 6
trn b 4 --data 'sh_*.bin' --stages 4 --steps 6
trn c 4 --data 'sh_*.bin' --tp 2 --dp 2 --steps 6

# a. one epoch: every sequence once over the replicas, each replica its own rows
rows a | awk '$1 <= 4 { print $3, $4 }' | sort > ep0.txt
own=$(awk '{ d = FILENAME ~ /\.0$/ ? 0 : 1; if (int($2 / 4) != d) bad++ } END { print bad + 0 }' a.0 a.1)
if grep -q "3 shards (.*shuffled per epoch)" a.out && [ "$(wc -l < ep0.txt)" = 32 ] && sort all.txt | cmp -s - ep0.txt \
    && [ "$own" = 0 ] && [ -s a.0 ] && [ -s a.1 ]; then
    ok "(1, 2, 2): every sequence of epoch 0 read exactly once over the 2 replicas, each replica its own rows"
else bad "epoch 0" "$(wc -l < ep0.txt) rows, $(sort all.txt | comm -3 - ep0.txt | head -3 | tr '\n' ';'), rows of the other replica: $own"; fi
rows a | awk '$1 <= 4 { print $3, $4 }' > ep0o.txt
rows a | awk '$1 > 4 { print $3, $4 }' > ep1.txt
! cmp -s all.txt ep0o.txt && ! head -16 ep0o.txt | cmp -s - ep1.txt && [ "$(wc -l < ep1.txt)" = 16 ] \
    && ok "the epoch is not in file order, and epoch 1 starts in another order than epoch 0" \
    || bad "order" "$(head -3 ep0o.txt | tr '\n' ';') / $(head -3 ep1.txt | tr '\n' ';')"

# b. the same rows step by step at (1, 1, 4) and (2, 2, 1)
if [ "$(rows a | wc -l)" = 48 ] && [ "$(rows a)" = "$(rows b)" ] && [ "$(rows a)" = "$(rows c)" ] \
    && close a.jsonl b.jsonl 1e-6 > /dev/null && close a.jsonl c.jsonl 1e-5 > /dev/null; then
    ok "(1, 2, 2), (1, 1, 4) and (2, 2, 1) read the same rows at every step, and their losses agree"
else bad "layouts" "$(diff <(rows a) <(rows b) | head -2 | tr '\n' ';') $(diff <(rows a) <(rows c) | head -2 | tr '\n' ';')"; fi

# the batches read one step ahead on a thread (the default) are those read when needed
PIPELM_PREFETCH=0 trn np 4 --data 'sh_*.bin' --dp 2 --stages 2 --steps 6 --timers-every 3
[ -n "$(losses a.jsonl)" ] && [ "$(losses a.jsonl)" = "$(losses np.jsonl)" ] && [ "$(rows a)" = "$(rows np)" ] \
    && grep -q '"data_ms":' np.jsonl && grep -q "data wait" np.out \
    && ok "prefetched one step ahead: the losses of reading each batch when needed, bit for bit; the data wait in the timers" \
    || bad "prefetch" "$(losses a.jsonl | tr '\n' ' ') vs $(losses np.jsonl | tr '\n' ' ')"

# c. 3 steps at (1, 1, 4), resumed mid-epoch at (2, 2, 1)
trn r1 4 --data 'sh_*.bin' --stages 4 --steps 3 --ckpt-dir ck --ckpt-every 3
trn r2 4 --data 'sh_*.bin' --tp 2 --dp 2 --steps 6 --ckpt-dir ck --resume
if grep -q "resumed from ck/ckpt_00000003.h5" r2.out && [ "$(rows r2 | wc -l)" = 24 ] \
    && [ "$(rows r2)" = "$(rows a | awk '$1 > 3')" ] && [ "$(rows r1)" = "$(rows a | awk '$1 <= 3')" ] \
    && [ "$(losses r2.jsonl | wc -l)" = 3 ] && close r2.jsonl a.jsonl 1e-5 > /dev/null; then
    ok "resumed mid-epoch at another layout ((1, 1, 4) -> (2, 2, 1)): steps 4-6 read as the straight run, losses agree"
else bad "resume" "$(grep -m1 -E 'resumed|error' r2.out) $(diff <(rows r2) <(rows a | awk '$1 > 3') | head -2 | tr '\n' ';')"; fi

# d. --shuffle 0 and 1, and refusals
trn s0 1 --data 'sh_*.bin' --shuffle 0 --steps 4
trn s1 1 --data sh_1.bin --shuffle 1 --steps 1
trn s1d 1 --data sh_1.bin --steps 1
rows s0 | awk '{ print $3, $4 }' | cmp -s all.txt - && grep -q "3 shards (.*in order)" s0.out \
    && ok "--shuffle 0: the shards in name order, each one's sequences in file order" \
    || bad "--shuffle 0" "$(rows s0 | head -3 | tr '\n' ';')"
n1=$(rows s1 | awk '{ print $4 }' | sort -n | uniq | wc -l)
[ "$n1" = 8 ] && [ "$(rows s1d | awk '{ print $4 }' | tr '\n' ' ')" = "0 16 32 48 64 80 96 112 " ] \
    && [ "$(rows s1 | awk '{ print $4 }' | tr '\n' ' ')" != "0 16 32 48 64 80 96 112 " ] \
    && grep -q "1 shard (.*shuffled per epoch)" s1.out \
    && ok "--shuffle 1 shuffles a single file's sequences (read in order without it)" \
    || bad "--shuffle 1" "$(rows s1 | awk '{ print $4 }' | tr '\n' ' ') / $(rows s1d | awk '{ print $4 }' | tr '\n' ' ')"
expect "--shuffle 1 with Markov data, refused" 2 "--shuffle 1 reads llm.c token files" \
    "$MPIEXEC" -n 1 "$PIPELM" train --preset tiny --steps 1 --shuffle 1
expect "--shuffle 2, refused" 2 "--shuffle must be 0 or 1 (got 2)" "$MPIEXEC" -n 1 "$PIPELM" train --preset tiny --steps 1 --shuffle 2

# e. the checkpoint's list of shards (names, sizes, header CRCs) and order: a changed list is
# refused by name, or accepted with --data-changed 1
trn e1 1 --data 'sh_*.bin' --steps 2 --ckpt-dir ce --ckpt-every 2
cp sh_1.bin sh_3.bin
R="train $C --steps 3 --ckpt-dir ce --resume"
expect "a shard added since the checkpoint, refused by name" 2 "the files of --data are not those it was trained on: shard 4, sh_3.bin, is new" \
    "$MPIEXEC" -n 1 "$PIPELM" $R --data 'sh_*.bin'
rm sh_3.bin
expect "--shuffle changed on resume, refused" 2 "the order: shuffle=1 in the checkpoint, shuffle=0 now" \
    "$MPIEXEC" -n 1 "$PIPELM" $R --data 'sh_*.bin' --shuffle 0
head -c 1330 sh_2.bin > t.bin && /usr/bin/python3 -c "
import struct; b = bytearray(open('t.bin', 'rb').read()); b[8:12] = struct.pack('<i', 153); open('sh_2.bin', 'wb').write(b)"
expect "a shard rewritten shorter, refused by name" 2 "shard sh_2.bin changed: (name, bytes, header CRC-32C) sh_2.bin,1350,.* in the checkpoint, sh_2.bin,1330,.* now" \
    "$MPIEXEC" -n 1 "$PIPELM" $R --data 'sh_*.bin'
mpirun_t 60 1 $R --data 'sh_*.bin' --data-changed 1 > e2.out 2>&1 && grep -q "note: --data-changed 1: the files of --data differ" e2.out \
    && grep -q "resumed from ce/ckpt_00000002.h5" e2.out && ok "--data-changed 1 resumes on a changed list, with a note" \
    || bad "--data-changed 1" "$(grep -m2 -E 'error|note' e2.out)"
finish
