#!/bin/bash
# test_eval.sh — `pipelm eval`: the loss of a model file or a checkpoint equals, bit for bit,
# the validation loss the trainer reports for the same weights, batches and micro-batch count,
# on P = 1..4 stages and D = 1, 2 replicas (and with chunks, Llama, a token file and a
# checkpoint directory); --json holds loss, perplexity and tokens; bad input is refused by name.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
C="--preset tiny --seq-len 32 --batch 8 --progress 0 --log-every 100"
# json_key FILE KEY: the value of KEY in a one-line JSON object
json_key() { sed 's/.*"'"$2"'":\([^,}]*\).*/\1/' "$1"; }
# val_of METRICS: the last val_loss of a metrics file
val_of() { grep '"event":"val"' "$1" | tail -1 | sed 's/.*"val_loss":\([^,}]*\).*/\1/'; }

# the trainer: 4 steps, M = 4, its validation loss at the end, the weights, a checkpoint
mpirun_t 120 1 train $C --steps 4 --microbatches 4 --val-batches 3 --metrics tr.jsonl --save-final w.bin \
    --ckpt-dir ck > tr.out 2>&1 || bad "train" "exit $? $(tail -3 tr.out)"
want=$(val_of tr.jsonl)
for P in 1 2 3 4; do
    mpirun_t 120 $P eval $C --init w.bin --microbatches 4 --batches 3 --json e$P.json > e$P.out 2>&1
    got=$(json_key e$P.json loss)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then ok "eval --init on P=$P: the trainer's val_loss bit for bit ($got)"
    else bad "eval P=$P" "loss $got, trainer $want ($(tail -2 e$P.out))"; fi
done
ppl=$(json_key e1.json perplexity); tok=$(json_key e1.json tokens)
if [ "$tok" = 768 ] && awk -v l="$want" -v p="$ppl" 'BEGIN { exit !(p > 0 && (p - exp(l)) ^ 2 < 1e-18 * p * p) }'
then ok "--json: perplexity = exp(loss), tokens = batches x batch x seq-len"; else bad "--json" "$(cat e1.json)"; fi
# from the checkpoint directory (its latest), and with chunks
mpirun_t 120 2 eval $C --resume ck --microbatches 4 --batches 3 --json ck.json > ck.out 2>&1
[ "$(json_key ck.json loss)" = "$want" ] && ok "eval --resume DIR on P=2: the same bits" || bad "resume" "$(tail -3 ck.out)"
mpirun_t 120 2 eval $C --init w.bin --microbatches 4 --batches 3 --chunks-per-rank 2 --schedule interleaved-1f1b \
    --json ch.json > ch.out 2>&1
[ "$(json_key ch.json loss)" = "$want" ] && ok "eval with --chunks-per-rank 2: the same bits" || bad "chunks" "$(tail -3 ch.out)"
mpirun_t 120 2 eval $C --init w.bin --microbatches 4 --batches 3 --schedule zb-v --json zv.json > zv.out 2>&1
[ "$(json_key zv.json loss)" = "$want" ] && ok "eval with zb-v's V placement (a stage's input copied on its rank): the same bits" \
    || bad "zb-v" "$(tail -3 zv.out)"

# D = 2: the trainer with --dp 2 against eval with --dp 2 on 2 and 4 ranks
mpirun_t 120 2 train $C --steps 2 --microbatches 2 --dp 2 --val-batches 2 --metrics d.jsonl --save-final wd.bin \
    > d.out 2>&1 || bad "train --dp 2" "exit $?"
want=$(val_of d.jsonl)
for W in 2 4; do
    mpirun_t 120 $W eval $C --init wd.bin --microbatches 2 --dp 2 --batches 2 --json d$W.json > d$W.out 2>&1
    [ -n "$want" ] && [ "$(json_key d$W.json loss)" = "$want" ] && ok "eval --dp 2 on $W ranks: the trainer's bits" \
        || bad "dp $W" "$(json_key d$W.json loss) vs $want $(tail -2 d$W.out)"
done

# Llama, and a token file evaluated whole: the trainer's --val-data
L="--preset llama-tiny --seq-len 16 --batch 4 --progress 0 --log-every 100"
python3 -c "
import struct, random
random.seed(5); n = 16 * 4 * 3 + 1
open('val.bin', 'wb').write(struct.pack('<256i', 20240520, 1, n, *([0] * 253)) + struct.pack('<%dH' % n, *[random.randrange(256) for _ in range(n)]))"
mpirun_t 120 1 train $L --steps 2 --microbatches 2 --val-data val.bin --val-batches 3 --metrics l.jsonl \
    --save-final wl.bin > l.out 2>&1 || bad "train llama" "exit $? $(tail -2 l.out)"
want=$(val_of l.jsonl)
for P in 1 3; do
    mpirun_t 120 $P eval $L --init wl.bin --microbatches 2 --data val.bin --json l$P.json > l$P.out 2>&1
    [ -n "$want" ] && [ "$(json_key l$P.json loss)" = "$want" ] && [ "$(json_key l$P.json batches)" = 3 ] \
        && ok "Llama on P=$P, the whole token file (3 batches): the trainer's bits" \
        || bad "llama P=$P" "$(cat l$P.json) vs $want $(tail -2 l$P.out)"
done

expect "a bad --batches is refused by name" 2 "batches" "$PIPELM" eval --batches x
expect "a missing checkpoint is refused" 1 "resume" mpirun_t 60 1 eval $C --resume nothere
expect "a directory as --json is refused" 1 "json" mpirun_t 60 1 eval $C --json .
finish
