#!/bin/bash
# test_config.sh — one validation of a configuration: what start-up accepts trains, saves and
# resumes, and what a checkpoint (or an --init header) would refuse is refused at start-up by
# name; bad settings found after parsing exit 2 on every rank (no hang).
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
run() { timeout -k 5 60 "$PIPELM" "$@"; }
T="--steps 1 --log-every 100 --val-batches 1 --eval-every 0"


# ---- item 3: settings a checkpoint would refuse are refused at start-up ----
L="--preset llama-tiny --n-layer 2 --batch 4 --seq-len 16 $T"
expect "--norm-eps 1.5" 2 "\-\-norm-eps 1.5 is out of range (> 0 and <= 1)" run train $L --norm-eps 1.5 --ckpt-dir ck0 --ckpt-every 1
[ ! -e ck0 ] || [ -z "$(ls ck0)" ] && ok "--norm-eps 1.5 saved nothing" || bad "--norm-eps 1.5 saved nothing" "$(ls ck0)"
expect "--norm-eps 0" 2 "\-\-norm-eps 0 is out of range" run train $L --norm-eps 0
expect "--rope-theta 1e39" 2 "\-\-rope-theta 1e+39 is out of range (> 1 and <= 1e30)" run train $L --rope-theta 1e39
expect "--rope-theta 1" 2 "\-\-rope-theta 1 is out of range" run train $L --rope-theta 1
expect "--ffn-dim-multiplier -1" 2 "\-\-ffn-dim-multiplier -1 is out of range (0..64, 0 = none)" run train $L --ffn-dim-multiplier -1
expect "--ffn-dim-multiplier 65" 2 "\-\-ffn-dim-multiplier 65 is out of range" run train $L --ffn-dim-multiplier 65
expect "--multiple-of 0" 2 "\-\-multiple-of 0 is out of range (1..1048576)" run train $L --multiple-of 0
expect "--use-scaled-rope 2" 2 "\-\-use-scaled-rope 2 is out of range (0..1)" run train $L --use-scaled-rope 2
expect "--n-kv-head 4 with 6 heads" 2 "n-head (6) must be a multiple of n-kv-head (4)" run train $L --n-kv-head 4
expect "--n-kv-head 12 with 6 heads" 2 "\-\-n-kv-head 12 is out of range (1..6" run train $L --n-kv-head 12
expect "--beta2 1" 2 "\-\-beta2 1 is out of range (in \[0, 1))" run train $T --beta2 1
expect "--lr -1" 2 "\-\-lr -1 is out of range (>= 0 and finite)" run train $T --lr -1
expect "--eps 0" 2 "\-\-eps 0 is out of range (> 0 and finite)" run train $T --eps 0
expect "--weight-decay -0.1" 2 "\-\-weight-decay -0.1 is out of range" run train $T --weight-decay -0.1
expect "--markov-branch 0" 2 "\-\-markov-branch 0 is out of range (1..256, the vocab-size)" run train $T --markov-branch 0
expect "--markov-branch 257" 2 "\-\-markov-branch 257 is out of range (1..256" run train $T --markov-branch 257
printf 'preset = llama-tiny\nnorm_eps = 2\n' > bad.ini
expect "config file norm_eps = 2" 2 "\-\-norm-eps 2 is out of range" run train $T --config bad.ini

# the extremes that are accepted train, save and resume. --multiple-of 1048576 makes the MLP
# 2^20 wide: one block of 4 channels (head size 2, still grouped-query) keeps that at 12.6 M
# parameters, a 151 MB checkpoint saved once (at the end of the first run), instead of the
# 1.8 GB saved twice that made this one check take a minute and a half
X="--n-layer 1 --n-embd 4 --n-head 2 --n-kv-head 1 --norm-eps 1 --rope-theta 1e30 --ffn-dim-multiplier 64"
run train $L $X --multiple-of 1048576 --steps 2 --ckpt-dir ck1 > ext1.out 2>&1
rc=$?
run train $L $X --multiple-of 1048576 --steps 3 --ckpt-dir ck1 --resume > ext2.out 2>&1
if [ $rc -eq 0 ] && [ $? -eq 0 ] && grep -q "resumed from .*step 2" ext2.out; then ok "llama extremes (norm-eps 1, rope-theta 1e30, ffn 64) train, save, resume"
else bad "llama extremes train, save, resume" "$(tail -n 3 ext1.out ext2.out)"; fi
run train $T --steps 2 --beta1 0 --beta2 0.999999 --lr 0 --min-lr 0 --weight-decay 0 --grad-clip 0 --markov-branch 256 \
    --ckpt-dir ck2 --ckpt-every 1 > g1.out 2>&1
rc=$?
run train $T --steps 3 --beta1 0 --beta2 0.999999 --lr 0 --min-lr 0 --weight-decay 0 --grad-clip 0 --markov-branch 256 \
    --ckpt-dir ck2 --resume > g2.out 2>&1
if [ $rc -eq 0 ] && [ $? -eq 0 ] && grep -q "resumed from .*step 2" g2.out; then ok "optimizer extremes train, save, resume"
else bad "optimizer extremes train, save, resume" "$(tail -n 3 g1.out g2.out)"; fi

# an --init Llama header the checkpoint would refuse: refused at start-up, naming the field
run train $L --save-final ll.bin > ll.out 2>&1 || bad "llama --save-final" "$(tail -n 3 ll.out)"
patch() { # patch IN OUT OFFSET FMT VALUE: write one little-endian int32 (i) or float32 (f)
    python3 - "$@" <<'PY'
import struct, sys
src, dst, off, fmt, val = sys.argv[1:]
b = bytearray(open(src, 'rb').read())
b[int(off):int(off) + 4] = struct.pack('<' + fmt, float(val) if fmt == 'f' else int(val))
open(dst, 'wb').write(b)
PY
}
patch ll.bin eps2.bin $((1024 + 4)) f 2
patch ll.bin minor.bin $((11 * 4)) i 2000
patch ll.bin ffn.bin 1024 f -1
expect "--init header norm_eps = 2" 1 "bad header: norm-eps = 2 is out of range (> 0 and <= 1)" run train $T --init eps2.bin
expect "--init header llama_version_minor = 2000" 1 "bad header: llama-version-minor = 2000 is out of range (0..1000)" \
    run train $T --init minor.bin
expect "--init header ffn_dim_multiplier = -1" 1 "bad header: ffn-dim-multiplier = -1 is out of range" run train $T --init ffn.bin

# ---- item 9: --init conflicts name only what was given; --init with --resume ----
expect "llama --init with an unrelated flag" 0 "done:" run train $T --init ll.bin --n-layer 2 --seq-len 16 --batch 4
expect "llama --init, a given dimension differs" 2 "\-\-n-layer 3 conflicts with ll.bin, which has n-layer 2" \
    run train $T --init ll.bin --n-layer 3 --seq-len 16 --batch 4
expect "llama --init, --norm-eps differs" 2 "\-\-norm-eps 0.001 conflicts with ll.bin" \
    run train $T --init ll.bin --norm-eps 1e-3 --seq-len 16 --batch 4
expect "llama --init, --arch gpt2 given" 2 "\-\-arch gpt2 conflicts with ll.bin, which is a llama model" \
    run train $T --init ll.bin --arch gpt2 --seq-len 16 --batch 4
expect "--init beside --resume" 2 "\-\-init cannot be used with --resume" run train $T --init ll.bin --resume ck1

# ---- item 9: --markov-branch 1 runs the branch-1 chain it records, and resumes ----
run train $T --steps 2 --markov-branch 1 --ckpt-dir ck3 --ckpt-every 1 > mb1.out 2>&1
rc=$?
run train $T --steps 3 --markov-branch 1 --ckpt-dir ck3 --resume > mb2.out 2>&1
if [ $rc -eq 0 ] && [ $? -eq 0 ] && grep -q "branch=1," mb1.out && grep -q "entropy floor 0.0000" mb1.out &&
   grep -q "resumed from .*step 2" mb2.out; then ok "--markov-branch 1: a branch-1 chain, saved and resumed"
else bad "--markov-branch 1" "$(grep -h "data:\|error" mb1.out mb2.out | head -n 3)"; fi

# ---- item 7: bad settings found after parsing exit 2 ----
expect "--seq-len above max-seq-len" 2 "\-\-seq-len 1000 is out of range (1..64, the model's max-seq-len)" run train $T --seq-len 1000
expect "--batch not divisible by --microbatches" 2 "not divisible by --microbatches" run train $T --batch 10 --microbatches 4
expect "--split not summing to n-layer" 2 "adds up to 3 blocks but the model has n-layer=4" run train $T --split 3
expect "--split with the wrong count" 2 "gives 2 stages but the pipeline has 1" run train $T --split 2,2
expect "--recompute of the wrong length" 2 "give one mode or one per stage (1 here), not 2" run train $T --recompute none,full
expect "chunks with gpipe" 2 "gpipe runs one chunk per rank" run train $T --schedule gpipe --chunks-per-rank 2
expect "--dp not dividing the world" 2 "does not fit 1 ranks" run train $T --dp 2

# multi-rank: every rank exits 2, none hangs
mexpect() { # mexpect NAME NP PATTERN ARGS...
    local name=$1 np=$2 pat=$3
    shift 3
    local out rc
    out=$(mpirun_t 90 "$np" "$@" 2>&1)
    rc=$?
    if [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -q -- "$pat"; then ok "$name"
    else bad "$name" "exit $rc (want 2), output: $(printf '%s' "$out" | head -c 400)"; fi
}
mexpect "--dp 3 on 4 ranks" 4 "does not fit 4 ranks" train $T --dp 3
mexpect "--batch not divisible by dp x microbatches" 4 "must be divisible by --dp 2 x --microbatches 4" \
    train $T --dp 2 --batch 4 --microbatches 4
mexpect "too many chunks" 2 "8 stages need at least 6 blocks" train $T --chunks-per-rank 4 --schedule interleaved-1f1b --microbatches 4 --batch 8
mexpect "--split 4 on --dp 2 names P x D ranks" 4 "run with mpiexec -n 2 (1 stage x --dp 2" train $T --dp 2 --split 4
mexpect "--split sum on 2 ranks" 2 "adds up to 3 blocks" train $T --split 1,2
mexpect "--recompute wrong length on 2 ranks" 2 "give one mode or one per stage (2 here), not 3" \
    train $T --recompute none,full,none
mexpect "--n-kv-head 4 with 6 heads on 2 ranks" 2 "must be a multiple of n-kv-head (4)" train $L --n-kv-head 4

finish
