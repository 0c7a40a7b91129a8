#!/bin/bash
# test_inout.sh — outputs over inputs and streams as inputs, in every subcommand (issue 37,
# items 1, 2 and the smaller ones of 9): an output that is an input, a file inside an input
# directory or another output is refused with exit 2, naming both options, and every input is
# byte-for-byte unchanged (checksums before and after); a FIFO (made here) or a process
# substitution given as --prompt-file or --tokenizer is refused by name, on 1 and 2 ranks,
# under a timeout (it used to block in open() or be read by one rank only); a 2-rank
# --prompt-file is read once and gives the one-rank tokens; blank prompt lines, empty ids,
# a costs file of another stage count and a bad train option after `tune --` are refused.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0 --log-every 100"
mpirun_t 120 1 train $C --steps 4 --save-final m.bin --ckpt-dir ck --ckpt-every 4 > tr.out 2>&1 || bad "train" "exit $?"
mpirun_t 120 1 bench $C --steps 2 --warmup 0 --costs-out c.txt > b.out 2>&1 || bad "bench costs" "exit $?"
python3 -c "
import struct
n = 4 * 4 * 16 + 1
open('d.bin', 'wb').write(struct.pack('<256i', 20240520, 1, n, *([0] * 253)) + struct.pack('<%dH' % n, *[(i * 7) % 256 for i in range(n)]))"
"$PIPELM" convert --to hf m.bin hfd > /dev/null 2>&1 || bad "convert to hf" "failed"
printf '1,2,3\n4 5\n' > p.txt
echo same > x.txt
md5sum m.bin d.bin c.txt p.txt x.txt ck/* hfd/* > inputs.md5

# refused NAME NP PATTERN ARGS...: exit 2, the message names both, every input unchanged
refused() {
    local name=$1 np=$2 pat=$3
    shift 3
    mpirun_t 60 "$np" "$@" > o.out 2>&1; local rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pat" o.out && md5sum -c --quiet inputs.md5 > /dev/null 2>&1; then ok "$name: refused (exit 2), inputs unchanged"
    else bad "$name" "rc=$rc $(grep -m1 error o.out) $(md5sum -c --quiet inputs.md5 2>&1 | head -2)"; fi
}
S="is the same file as"
refused "eval --json over --data" 1 "--json d.bin $S --data d.bin" eval $C --init m.bin --data d.bin --json d.bin
refused "eval --json over --init" 1 "--json m.bin $S --init m.bin" eval $C --init m.bin --json m.bin
refused "eval --json over a checkpoint in --resume DIR" 1 "--json ck/ckpt_00000004.h5 $S --resume ck" \
    eval $C --resume ck --json ck/ckpt_00000004.h5
refused "eval --json and --metrics one file" 1 "--metrics new.out $S --json new.out" eval $C --json new.out --metrics new.out
refused "eval --json over --val-data" 1 "--json d.bin $S --val-data d.bin" eval $C --init m.bin --val-data d.bin --json d.bin
G="--init m.bin --prompt-tokens 1,2 --max-new-tokens 2"
refused "generate --tokens-out over --init" 1 "--tokens-out m.bin $S --init" generate $G --tokens-out m.bin
refused "generate --logits-out over --init" 2 "--logits-out m.bin $S --init" generate $G --logits-out m.bin
refused "generate --tokens-out over --prompt-file" 1 "--tokens-out p.txt $S --prompt-file" \
    generate --init m.bin --prompt-file p.txt --tokens-out p.txt
refused "generate --tokens-out over --tokenizer" 1 "--tokens-out x.txt $S --tokenizer x.txt" \
    generate $G --tokenizer x.txt --tokens-out x.txt
refused "generate --logits-out and --tokens-out one file" 1 "--tokens-out n2 $S --logits-out n2" \
    generate $G --logits-out n2 --tokens-out n2
refused "bench --generate --json over --prompt-file" 1 "--json p.txt $S --prompt-file" \
    bench --generate --init m.bin --prompt-file p.txt --json p.txt
refused "tune --json over --costs" 1 "--json c.txt $S --costs c.txt" tune --costs c.txt --stages 1 --costs-microbatches 2 --json c.txt
refused "train --metrics over --costs-in" 1 "--metrics c.txt $S --costs-in c.txt" \
    train $C --steps 1 --schedule auto --costs-in c.txt --metrics c.txt
refused "bench --json over --costs-in" 1 "--json c.txt $S --costs-in c.txt" bench $C --steps 1 --costs-in c.txt --json c.txt
refused "convert into its Hugging Face input directory" 1 "output hfd/config.json $S input hfd" \
    convert hfd hfd/config.json
refused "convert --dtype bf16 over its own safetensors" 1 "output hfd/model.safetensors $S input hfd" \
    convert --to hf --dtype bf16 hfd hfd/model.safetensors

# streams: refused by name at once, on every rank, never a hang
mkfifo ff
for np in 1 2; do
    mpirun_t 30 $np generate --init m.bin --prompt-file ff > o.out 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "rank 0: error: --prompt-file ff: is a FIFO" o.out && [ "$(grep -c error o.out)" = 1 ]; then
        ok "--prompt-file FIFO on $np ranks: refused once by name, no hang"
    else bad "--prompt-file FIFO np=$np" "rc=$rc $(grep -m2 error o.out)"; fi
    mpirun_t 30 $np generate $G --tokenizer ff > o.out 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -q "rank 0: error: --tokenizer ff: is a FIFO" o.out && [ "$(grep -c error o.out)" = 1 ]; then
        ok "--tokenizer FIFO on $np ranks: refused once by name, no hang"
    else bad "--tokenizer FIFO np=$np" "rc=$rc $(grep -m2 error o.out)"; fi
    # a writer on the FIFO: still refused (never one rank reading it and another EOF)
    (timeout 10 sh -c 'printf "1,2,3\n" > ff' &)
    mpirun_t 30 $np generate --init m.bin --prompt-file ff > o.out 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "is a FIFO" o.out; then ok "--prompt-file FIFO with a writer on $np ranks: refused"
    else bad "--prompt-file FIFO + writer np=$np" "rc=$rc $(grep -m2 error o.out)"; fi
    timeout 5 cat ff > /dev/null 2>&1 # the writer, if still there
done
mpirun_t 30 2 generate $G --logits-out ff > o.out 2>&1; rc=$?
if [ $rc -eq 1 ] && [ -p ff ] && grep -q "error: --logits-out ff: is a FIFO" o.out; then ok "--logits-out FIFO: refused, never opened"
else bad "--logits-out FIFO" "rc=$rc $(grep -m1 error o.out)"; fi
timeout 30 "$PIPELM" generate --init m.bin --prompt-file <(printf '1,2,3\n') > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "is a FIFO" o.out; then ok "--prompt-file <(...): refused by name, no hang"
else bad "--prompt-file <(...)" "rc=$rc $(grep -m1 error o.out)"; fi
# a regular prompt file on 2 ranks: read once by rank 0, the tokens of one rank
mpirun_t 60 1 generate --init m.bin --prompt-file p.txt --max-new-tokens 4 --tokens-out one.tok > o.out 2>&1
mpirun_t 60 2 generate --init m.bin --prompt-file p.txt --max-new-tokens 4 --tokens-out two.tok > o2.out 2>&1; rc=$?
if [ $rc -eq 0 ] && [ -s one.tok ] && cmp -s one.tok two.tok; then ok "--prompt-file on 2 ranks: the tokens of one rank"
else bad "--prompt-file 2 ranks" "rc=$rc $(grep -m1 error o2.out)"; fi

# smaller ones
expect "--prompt-tokens 1,,2: an empty id refused" 2 "an empty token id" mpirun_t 30 1 generate --init m.bin --prompt-tokens 1,,2
printf '1,2\n\n3\n' > blank.txt
expect "a blank line in --prompt-file refused by its number" 2 "blank.txt line 2: a blank line" \
    mpirun_t 30 2 generate --init m.bin --prompt-file blank.txt
expect "tune --stages 3 with 1-stage costs: the mismatch is named" 2 "holds 1 stages but --stages is 3" \
    mpirun_t 30 1 tune --costs c.txt --stages 3 --costs-microbatches 2
expect "tune --verify with a bad option after --: exit 2" 2 "unknown option '--bogus'" \
    mpirun_t 60 1 tune --costs c.txt --stages 1 --costs-microbatches 2 --verify 1 -- --bogus 1
python3 -c "
import struct
open('neg.bin', 'wb').write(struct.pack('<256i', 20240520, 1, -5, *([0] * 253)))"
mpirun_t 60 1 train $C --steps 1 --data neg.bin > o.out 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "token file neg.bin: header says -5 tokens, a negative count" o.out && ! grep -q "1024 bytes" o.out; then
    ok "a token file whose header says -5 tokens: named as a negative count"
else bad "negative token count" "rc=$rc $(grep -m1 error o.out)"; fi
mpirun_t 60 3 train $C --steps 1 --init m.bin --n-layer 3 > o.out 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c "error: --n-layer 3 conflicts with m.bin" o.out)" = 1 ] && grep -q "rank 0: error" o.out; then
    ok "a settings error every rank sees alike: printed once (rank 0), not once per rank"
else bad "settings error once" "rc=$rc $(grep -c error o.out) lines"; fi

# eval and generate say what they did (item 7): the evaluated file, a count clamped with a
# note, a model setting that conflicts with the checkpoint refused as with --init
mpirun_t 60 1 eval $C --init m.bin --val-data d.bin > e.out 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "^evaluated data: .*d.bin" e.out && ! grep -q "^data: markov" e.out; then
    ok "eval --val-data d.bin names d.bin as the evaluated data (not the Markov --data)"
else bad "eval names its data" "rc=$rc $(grep -m2 data e.out)"; fi
mpirun_t 60 1 eval $C --init m.bin --data d.bin --batches 4 --json e4.json > e.out 2>&1
for nb in 5 100; do
    mpirun_t 60 1 eval $C --init m.bin --data d.bin --batches $nb --json e$nb.json > e.out 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "note: --batches $nb: d.bin holds 4 whole batches" e.out && grep -q "in 4 batches" e.out &&
        cmp -s <(sed 's/"seconds".*//' e4.json) <(sed 's/"seconds".*//' e$nb.json); then
        ok "eval --batches $nb on a 4-batch file: clamped to 4 with a note, the loss of --batches 4 (no batch twice)"
    else bad "eval --batches $nb" "rc=$rc $(grep -m2 -E 'note|eval \|' e.out)"; fi
done
mpirun_t 120 1 train --preset llama-tiny --batch 4 --microbatches 2 --seq-len 16 --progress 0 --steps 1 --ckpt-dir lk > l.out 2>&1
for kv in "--n-layer 3" "--n-kv-head 1" "--rope-theta 500000" "--norm-eps 0.1"; do
    for sub in eval generate; do
        extra=""; [ $sub = generate ] && extra="--prompt-tokens 1,2"
        mpirun_t 60 1 $sub --preset llama-tiny --resume lk $kv $extra > e.out 2>&1; rc=$?
        if [ $rc -eq 2 ] && grep -q -- "error: $kv conflicts with checkpoint lk" e.out; then
            ok "$sub --resume with $kv: the conflict with the checkpoint refused by name"
        else bad "$sub --resume $kv" "rc=$rc $(grep -m1 error e.out)"; fi
    done
done
md5sum -c --quiet inputs.md5 && ok "every input unchanged at the end" || bad "inputs" "changed"
finish
